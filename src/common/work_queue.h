// An owned pool for short asynchronous work (the core worker's fire-and-forget FreeObjects and
// ReturnLease calls; the head's actor placements, kills and bundle releases): closures run in
// FIFO order on up to `max_threads` threads, started on demand and kept until Stop. Every
// thread belongs to this object, and Stop() runs what is queued and joins them.
//
// Contract: with `capacity` > 0, Post() blocks while that many closures wait (back-pressure
// instead of unbounded growth), so a closure must never wait for a lock or event held by a
// thread that posts; with `capacity` 0 the queue is unbounded and Post() never waits (callers
// may hold locks). Post() never runs the closure on the caller's thread. A closure must end by
// itself in bounded time (Stop waits for it). After Stop() Post() runs nothing and returns false.
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

namespace torus {

class WorkQueue {
 public:
  WorkQueue(int max_threads, size_t capacity) : max_threads_(max_threads), capacity_(capacity) {}
  ~WorkQueue() { Stop(); }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  bool Post(std::function<void()> fn) EXCLUDES(mu_);
  size_t threads() const EXCLUDES(mu_);
  // Runs what is queued, then joins the threads. Idempotent.
  void Stop() EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);

  const int max_threads_;
  const size_t capacity_;
  mutable Mutex mu_;
  CondVar work_cv_;  // work queued, or stopping
  CondVar room_cv_;  // a queued closure was taken, or stopping
  std::deque<std::function<void()>> q_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
  int idle_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
};

}  // namespace torus::core
