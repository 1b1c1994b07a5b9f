// LogForwarder (workers): sends what user code writes to stdout/stderr (fds 1 and 2) to the
// driver of the work being run (its PrintLogs), besides the worker's log files, which fds 1 and
// 2 pointed at before Start().
//
// THREADS: Start() (once, early, on the main thread) puts a pipe in place of fds 1 and 2. One
// reader thread per pipe copies what arrives to the log file and splits it into lines, queued
// under mu_. The forwarder thread waits on cv_ for lines, lets more gather for 20 ms, takes
// them under mu_ and sends them with no lock held (asking `driver_address` for the target;
// with no driver yet they are dropped: they are in the log files already). Stop() (or the
// destructor) puts the log files back on fds 1 and 2, wakes the three threads and joins them.
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"

namespace torus::core {

class LogForwarder {
 public:
  struct Identity {
    std::string worker_id, node_id, token;
  };
  LogForwarder(Identity id, std::function<std::string()> driver_address);
  ~LogForwarder() { Stop(); }
  LogForwarder(const LogForwarder&) = delete;
  LogForwarder& operator=(const LogForwarder&) = delete;

  // Captures fds 1 and 2 and starts the threads. False if a pipe cannot be made.
  bool Start() EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);

 private:
  void ReadLoop(int read_fd, int log_fd, bool is_err) EXCLUDES(mu_);
  void ForwardLoop() EXCLUDES(mu_);

  const Identity id_;
  const std::function<std::string()> driver_address_;
  Mutex mu_;
  CondVar cv_;  // lines queued, or stopping
  std::vector<std::string> out_lines_ GUARDED_BY(mu_), err_lines_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  // Set by Start() before the threads start, read by Stop() after it joined them.
  std::vector<std::thread> threads_;
  int log_fds_[2] = {-1, -1};   // the log files, for fds 1 and 2
  int stop_pipe_[2] = {-1, -1};  // Stop() closes the write end: the readers wake
};

}  // namespace torus::core
