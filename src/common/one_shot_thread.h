// OneShotThread: runs one closure, once, on a thread this object owns and joins. For the
// Shutdown RPC of the head and the node: a handler cannot run Stop() itself, because stopping
// the server waits for every handler in flight, that one included.
//
// THREADS: Run() from any thread, any number of times (only the first call starts the
// closure). Join() and the destructor from any thread but the closure's own; the owner joins
// before the state the closure uses is destroyed. mu_ guards the thread.
#pragma once

#include <functional>
#include <thread>

#include "common/thread_annotations.h"

namespace torus {

class OneShotThread {
 public:
  OneShotThread() = default;
  ~OneShotThread() { Join(); }
  OneShotThread(const OneShotThread&) = delete;
  OneShotThread& operator=(const OneShotThread&) = delete;

  // Starts `fn` on the owned thread unless a closure was started before; true when this call
  // started it.
  bool Run(std::function<void()> fn) EXCLUDES(mu_);
  // Waits until the closure (if one was started) has returned.
  void Join() EXCLUDES(mu_);

 private:
  Mutex mu_;
  bool started_ GUARDED_BY(mu_) = false;
  std::thread thread_ GUARDED_BY(mu_);
};

}  // namespace torus
