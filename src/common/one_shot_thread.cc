#include "common/one_shot_thread.h"

#include <utility>

namespace torus {

bool OneShotThread::Run(std::function<void()> fn) {
  MutexLock lock(mu_);
  if (started_) return false;
  started_ = true;
  thread_ = std::thread(std::move(fn));
  return true;
}

void OneShotThread::Join() {
  std::thread t;
  {
    MutexLock lock(mu_);
    t.swap(thread_);
  }
  if (t.joinable()) t.join();
}

}  // namespace torus
