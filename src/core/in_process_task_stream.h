// InProcessTaskStream: a PushTasks stream between two threads of one process, for serving a
// TaskExecutor without sockets (tests; the in-process core). The submitter side sends batches
// (Send) and takes results (Take); the executor side is the server stream ServeTasks reads.
//
// THREADS: any thread may call any method; one internal mutex. Read and Take block.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "proto/torus.pb.h"

namespace torus::core {

class InProcessTaskStream {
 public:
  // Submitter side.
  void Send(rpc::TaskBatch b) {
    std::lock_guard<std::mutex> lock(mu_);
    batches_.push_back(std::move(b));
    cv_.notify_all();
  }
  // No more batches: ServeTasks's Read returns false once the queued ones are read.
  void CloseWrites() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }
  // The next result batch the executor wrote, waiting up to `timeout`; false if none came.
  bool Take(rpc::ResultBatch* out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !results_.empty(); })) return false;
    *out = std::move(results_.front());
    results_.pop_front();
    return true;
  }

  // Executor side (TaskExecutor::ServeTasks's Stream).
  bool Read(rpc::TaskBatch* b) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return closed_ || !batches_.empty(); });
    if (batches_.empty()) return false;
    *b = std::move(batches_.front());
    batches_.pop_front();
    return true;
  }
  bool Write(const rpc::ResultBatch& b) {
    std::lock_guard<std::mutex> lock(mu_);
    results_.push_back(b);
    cv_.notify_all();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<rpc::TaskBatch> batches_;
  std::deque<rpc::ResultBatch> results_;
  bool closed_ = false;
};

}  // namespace torus::core
