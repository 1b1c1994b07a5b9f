// PeriodicThread: one owned thread that runs a tick, waits the delay the tick asks for, and
// runs it again, until the tick says stop or Stop() is called. The wait is a condition-variable
// wait that Stop() cuts short: an idle node does not nap-poll.
//
// Used by the node (heartbeat, lease audit) and the head (node monitor).
//
// THREADS: Start() and Stop() from any thread (Stop() is idempotent). The tick runs on the
// owned thread with no lock of this class held. Stop() called from the tick itself (a node
// giving up from its heartbeat) only marks the stop; the destructor joins the thread then.
// mu_ guards stop_.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <thread>

#include "common/thread_annotations.h"

namespace torus {

class PeriodicThread {
 public:
  // The delay before the next tick, or nullopt to end the loop.
  using Tick = std::function<std::optional<std::chrono::milliseconds>()>;

  PeriodicThread() = default;
  ~PeriodicThread();
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Runs `tick` first after `first_delay`. Once only.
  void Start(std::chrono::milliseconds first_delay, Tick tick) EXCLUDES(mu_);
  // Ends the loop (a running tick finishes first) and joins the thread, unless called from it.
  void Stop() EXCLUDES(mu_);

 private:
  void Loop(std::chrono::milliseconds delay) EXCLUDES(mu_);

  Tick tick_;  // constant after Start
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by Start, joined by Stop or the destructor
};

}  // namespace torus
