// A small owned pool for short asynchronous work (fire-and-forget RPCs such as FreeObjects and
// ReturnLease): closures run in FIFO order on up to `max_threads` threads, started on demand,
// with at most `capacity` closures waiting. Replaces one detached thread per call: every
// thread belongs to this object, and Stop() runs what is queued and joins them.
//
// Contract: Post() blocks while `capacity` closures wait (back-pressure instead of unbounded
// growth), so a closure must never wait for a lock or event held by a thread that posts.
// After Stop() Post() runs nothing and returns false.
//
// THREADS: Post() from any thread; the pool's threads run the closures with no lock held.
// `mu_` guards the queue, the thread list and the flags; `work_cv_` wakes idle pool threads,
// `room_cv_` wakes posters blocked on a full queue.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"

namespace torus::core {

class WorkQueue {
 public:
  WorkQueue(int max_threads, size_t capacity) : max_threads_(max_threads), capacity_(capacity) {}
  ~WorkQueue() { Stop(); }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  bool Post(std::function<void()> fn) EXCLUDES(mu_);
  // Runs what is queued, then joins the threads. Idempotent.
  void Stop() EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);

  const int max_threads_;
  const size_t capacity_;
  Mutex mu_;
  CondVar work_cv_;  // work queued, or stopping
  CondVar room_cv_;  // a queued closure was taken, or stopping
  std::deque<std::function<void()>> q_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
  int idle_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
};

}  // namespace torus::core
