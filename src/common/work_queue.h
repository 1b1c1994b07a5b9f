// An owned pool for short asynchronous work (the core worker's fire-and-forget FreeObjects and
// ReturnLease calls; the head's actor placements, kills and bundle releases): closures run in
// FIFO order on up to `max_threads` threads, started on demand. A thread that has found no work
// for `idle_timeout` (10 s by default) retires, so a pool that served a burst of work shrinks back
// to no threads at all; the next Post starts one again. Every thread belongs to this object: a
// retired thread is joined by the next Post or by Stop, and Stop() runs what is queued and
// joins the rest.
//
// Contract: with `capacity` > 0, Post() blocks while that many closures wait (back-pressure
// instead of unbounded growth), so a closure must never wait for a lock or event held by a
// thread that posts; with `capacity` 0 the queue is unbounded and Post() never waits (callers
// may hold locks). Post() never runs the closure on the caller's thread. A closure must end by
// itself in bounded time (Stop waits for it). After Stop() Post() runs nothing and returns false.
//
// THREADS: Post() from any thread; the pool's threads run the closures with no lock held.
// `mu_` guards the queue, the thread lists and the flags; `work_cv_` wakes idle pool threads,
// `room_cv_` wakes posters blocked on a full queue.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"

namespace torus {

class WorkQueue {
 public:
  static constexpr std::chrono::milliseconds kDefaultIdleTimeout{10000};

  WorkQueue(int max_threads, size_t capacity, std::chrono::milliseconds idle_timeout = kDefaultIdleTimeout)
      : max_threads_(max_threads), capacity_(capacity), idle_timeout_(idle_timeout) {}
  ~WorkQueue() { Stop(); }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  bool Post(std::function<void()> fn) EXCLUDES(mu_);
  // Threads alive and not retired.
  size_t threads() const EXCLUDES(mu_);
  // Runs what is queued, then joins the threads. Idempotent.
  void Stop() EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);
  // Moves the calling pool thread from threads_ to retired_ (it is about to return).
  void RetireLocked() REQUIRES(mu_);

  const int max_threads_;
  const size_t capacity_;
  const std::chrono::milliseconds idle_timeout_;
  mutable Mutex mu_;
  CondVar work_cv_;  // work queued, or stopping
  CondVar room_cv_;  // a queued closure was taken, or stopping
  std::deque<std::function<void()>> q_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
  std::vector<std::thread> retired_ GUARDED_BY(mu_);  // returned or returning: to join
  int idle_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
};

}  // namespace torus
