// LogFiles: the catalog of one node's log files, for `torus logs` (docs/logs.md).
//
// CONTRACT
// - A file is this node's when it was claimed: the node's own stdout/stderr (ClaimOwnOutput), each
//   worker's .out/.err (the worker pool), each job process's output (the job runner). With
//   `session_dir` set, the session files of the logs directory that belong to no node, worker or
//   job (head.out, supervisor.err, ...) are listed too: the node started with the head serves them.
// - Files are read by name only: a name never becomes a path, so no request reaches a file outside
//   the catalog; only regular files are listed or read, never through a symbolic link. Claims of
//   workers' and jobs' files are bounded (the most recent kMaxClaims stay; the node's own files
//   always do); the files on disk are never touched.
// - Read returns at most 4 MiB per call; a negative offset starts at the last `tail_lines` lines.
//
// THREADS: every method may be called from any thread (one mutex; file reads happen outside it).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "proto/torus.pb.h"

namespace torus {

class LogFiles {
 public:
  static constexpr size_t kMaxClaims = 8192;

  // `session_logs_dir`: the directory whose unowned files this node lists ("" = none).
  explicit LogFiles(std::string session_logs_dir = "") : session_logs_dir_(std::move(session_logs_dir)) {}
  LogFiles(const LogFiles&) = delete;
  LogFiles& operator=(const LogFiles&) = delete;

  // Claims `path` as this node's log; `kind` is "node", "worker" or "job". A second claim of the
  // same file name replaces the first.
  void Claim(const std::string& path, const std::string& kind, const std::string& worker_id = "",
             const std::string& job_id = "");
  // Claims the regular files this process's stdout and stderr write to, if any.
  void ClaimOwnOutput();

  // The existing files of the catalog, sorted by name.
  rpc::LogFileList List() const;
  // Reads `req.name` (NotFound naming it when it is not in the catalog or gone from disk).
  Status Read(const rpc::ReadLogRequest& req, rpc::ReadLogReply* out) const;

 private:
  struct Entry {
    std::string path, kind, worker_id, job_id;
  };
  // The path of `name`, or "" (no lock held by the caller).
  std::string PathOf(const std::string& name, Entry* entry) const;
  // True for a file of the session directory that no node claims by its name's form.
  static bool SessionFileName(const std::string& name);

  const std::string session_logs_dir_;
  mutable Mutex mu_;
  std::map<std::string, Entry> by_name_ GUARDED_BY(mu_);
  std::deque<std::string> order_ GUARDED_BY(mu_);  // claim order, for the bound
};

// The byte offset where the last `lines` lines of the open file `fd` of `size` bytes start (`size`
// for 0 lines), looking back at most kMaxTailScan bytes. Lines end with '\n'; a last line without
// one counts.
inline constexpr int64_t kMaxTailScan = 16 << 20;
int64_t TailOffset(int fd, int64_t size, int lines);

}  // namespace torus
