// HeadStore: the head's durable state on local disk (docs/fault_tolerance.md), an SQLite
// database in WAL mode at <session dir>/head_state.sqlite3. Every record is bytes under
// (kind, id): a serialised protobuf record (an actor, a placement group, a job) or a KV value.
// Each Put/Delete is its own transaction, committed before it returns, so a change the head
// acknowledges after writing it survives a kill -9 of the head (synchronous=NORMAL: the WAL is
// written by the commit and synced at checkpoints, which loses nothing when a process dies; a
// power cut may lose the last commits, which a head restarted on another machine could not
// use anyway).
//
// Why SQLite: Debian ships it (libsqlite3), it is the most exercised embedded store there is,
// and WAL gives one writer with readers never blocked, which is all one head needs. LMDB would
// do as well; SQLite's single file is easier to inspect (`sqlite3 head_state.sqlite3`).
//
// THREADS: every method may be called from any thread; one mutex serialises the statements.
// Methods return errors as Status; a failed write is logged by the caller, which keeps serving
// from memory (the state is then only as durable as the last successful write).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"

struct sqlite3;
struct sqlite3_stmt;

namespace torus {

enum class StoreKind {
  kMeta = 0,            // the store's own facts (session, format version)
  kKv = 1,              // id: namespace + '\0' + key
  kActor = 2,           // rpc::ActorRecord + its creation spec (head/actors.cc)
  kPlacementGroup = 3,  // rpc::PlacementGroupRecord
  kDriverJob = 4,       // rpc::JobRequest of a connected driver
  kJob = 5,             // rpc::JobRecord of a submitted job (head/jobs.cc)
};

class HeadStore {
 public:
  // Opens (creating if absent) the database at `path`.
  static StatusOr<std::unique_ptr<HeadStore>> Open(const std::string& path);
  ~HeadStore();
  HeadStore(const HeadStore&) = delete;
  HeadStore& operator=(const HeadStore&) = delete;

  Status Put(StoreKind kind, std::string_view id, std::string_view value) EXCLUDES(mu_);
  Status Delete(StoreKind kind, std::string_view id) EXCLUDES(mu_);
  // Every record of `kind`, by id in byte order.
  StatusOr<std::vector<std::pair<std::string, std::string>>> LoadAll(StoreKind kind) EXCLUDES(mu_);
  // How many records of each kind but kMeta there are (what a resumed head takes over).
  StatusOr<size_t> Count(StoreKind kind) EXCLUDES(mu_);
  const std::string& path() const { return path_; }

  // The database file of a session directory.
  static std::string PathIn(const std::string& session_dir);

 private:
  HeadStore(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}
  Status Prepare() EXCLUDES(mu_);
  // The records' format (kMeta "format"): a new store gets kFormat; a store of another format,
  // or an unmarked one with records, is refused.
  static constexpr const char* kFormat = "1";
  Status CheckFormat() EXCLUDES(mu_);
  Status Error(const char* what) const REQUIRES(mu_);

  const std::string path_;
  Mutex mu_;
  sqlite3* db_ GUARDED_BY(mu_);
  sqlite3_stmt* put_ GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* del_ GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* load_ GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* count_ GUARDED_BY(mu_) = nullptr;
};

}  // namespace torus
