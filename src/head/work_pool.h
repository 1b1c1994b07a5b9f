// WorkPool: the head's short asynchronous work (an actor's placement call, a fire-and-forget
// kill, bundle releases nobody waits for) on owned threads instead of detached ones.
//
// Submit runs a job on an idle worker, or on a new worker while fewer than `max_threads`
// exist, or else queues it. Stop() refuses new jobs, lets the workers finish every job already
// submitted (the queue is drained, not dropped) and joins them; the destructor calls it. A
// job must therefore end by itself in bounded time (the head's calls carry deadlines or are
// cancelled first). Workers stay until Stop.
//
// Threading: Submit and Stop may be called from any thread, also with other locks held
// (Submit never runs the job inline and never waits). A job must not call Stop. mu_ guards
// every member below it.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"

namespace torus {

class WorkPool {
 public:
  explicit WorkPool(size_t max_threads);
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // False (and `job` dropped) once Stop has begun.
  bool Submit(std::function<void()> job) EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);
  size_t threads() const EXCLUDES(mu_);

 private:
  void Work() EXCLUDES(mu_);

  const size_t max_threads_;
  mutable Mutex mu_;
  CondVar cv_;  // a job was queued, or Stop began
  std::deque<std::function<void()>> queue_ GUARDED_BY(mu_);
  size_t idle_ GUARDED_BY(mu_) = 0;  // workers waiting for a job
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
};

}  // namespace torus
