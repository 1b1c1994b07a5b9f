// The threads of a `torus head` / `torus node` daemon's main() beyond those the Head and Node
// objects own: the signal thread and the head's malloc trimmer.
//
// Threading: each class owns one thread, started by its constructor and joined by its destructor
// (called on main's thread). SignalThread's callback runs on its own thread; MallocTrimmer's
// `stop_` is guarded by `mu_`.
#pragma once

#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "common/thread_annotations.h"

namespace torus {

// Waits in sigwait() for one of `set` (blocked in every thread of the process before any thread
// started) and calls `on_signal` once. The destructor, when no signal came, wakes the thread
// with a SIGTERM directed at it (consumed by its sigwait, without calling `on_signal`) and joins
// it. `set` must contain SIGTERM.
class SignalThread {
 public:
  SignalThread(const sigset_t& set, std::function<void()> on_signal)
      : set_(set), on_signal_(std::move(on_signal)), thread_([this] { Run(); }) {}
  ~SignalThread() {
    closing_ = true;
    pthread_kill(thread_.native_handle(), SIGTERM);
    thread_.join();
  }
  SignalThread(const SignalThread&) = delete;
  SignalThread& operator=(const SignalThread&) = delete;

 private:
  void Run() {
    int sig = 0;
    sigwait(&set_, &sig);
    if (!closing_) on_signal_();
  }

  // Constant after construction.
  const sigset_t set_;
  const std::function<void()> on_signal_;
  // Set by the destructor before it wakes the thread.
  std::atomic<bool> closing_{false};
  std::thread thread_;
};

// Returns freed heap memory to the system every `period` (malloc_trim) until destroyed; the
// destructor wakes the thread at once and joins it.
class MallocTrimmer {
 public:
  explicit MallocTrimmer(std::chrono::milliseconds period) : period_(period), thread_([this] { Run(); }) {}
  ~MallocTrimmer() {
    {
      MutexLock l(mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
    thread_.join();
  }
  MallocTrimmer(const MallocTrimmer&) = delete;
  MallocTrimmer& operator=(const MallocTrimmer&) = delete;

 private:
  void Run() EXCLUDES(mu_) {
    MutexLock l(mu_);
    while (!stop_) {
      auto next = std::chrono::steady_clock::now() + period_;
      while (!stop_ && std::chrono::steady_clock::now() < next) cv_.WaitUntil(l, next);
      if (stop_) break;
      l.Unlock();
      malloc_trim(0);
      l.Lock();
    }
  }

  // Constant after construction.
  const std::chrono::milliseconds period_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace torus
