#include "common/work_queue.h"

#include <utility>

namespace torus {

bool WorkQueue::Post(std::function<void()> fn) {
  MutexLock l(mu_);
  while (!stopping_ && capacity_ > 0 && q_.size() >= capacity_) room_cv_.Wait(l);
  if (stopping_) return false;
  q_.push_back(std::move(fn));
  if (idle_ == 0 && static_cast<int>(threads_.size()) < max_threads_) {
    threads_.emplace_back([this] { Loop(); });
  } else {
    work_cv_.NotifyOne();
  }
  return true;
}

size_t WorkQueue::threads() const {
  MutexLock l(mu_);
  return threads_.size();
}

void WorkQueue::Stop() {
  std::vector<std::thread> threads;
  {
    MutexLock l(mu_);
    stopping_ = true;
    work_cv_.NotifyAll();
    room_cv_.NotifyAll();
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
}

void WorkQueue::Loop() {
  MutexLock l(mu_);
  while (true) {
    while (q_.empty() && !stopping_) {
      idle_++;
      work_cv_.Wait(l);
      idle_--;
    }
    if (q_.empty()) return;  // stopping, and everything queued has run
    std::function<void()> fn = std::move(q_.front());
    q_.pop_front();
    room_cv_.NotifyOne();
    l.Unlock();
    fn();
    fn = nullptr;  // destroy captures outside the lock too
    l.Lock();
  }
}

}  // namespace torus::core
