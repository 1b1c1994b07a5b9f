#include "common/periodic_thread.h"

#include <utility>

namespace torus {

PeriodicThread::~PeriodicThread() {
  Stop();
  if (thread_.joinable()) thread_.join();  // Stop() ran on the thread itself
}

void PeriodicThread::Start(std::chrono::milliseconds first_delay, Tick tick) {
  tick_ = std::move(tick);
  thread_ = std::thread([this, first_delay] { Loop(first_delay); });
}

void PeriodicThread::Stop() {
  {
    MutexLock l(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void PeriodicThread::Loop(std::chrono::milliseconds delay) {
  while (true) {
    {
      MutexLock l(mu_);
      auto until = std::chrono::steady_clock::now() + delay;
      while (!stop_ && std::chrono::steady_clock::now() < until) cv_.WaitUntil(l, until);
      if (stop_) return;
    }
    std::optional<std::chrono::milliseconds> next = tick_();
    if (!next) return;
    delay = *next;
  }
}

}  // namespace torus
