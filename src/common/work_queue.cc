#include "common/work_queue.h"

#include <utility>

namespace torus {

bool WorkQueue::Post(std::function<void()> fn) {
  std::vector<std::thread> retired;
  {
    MutexLock l(mu_);
    while (!stopping_ && capacity_ > 0 && q_.size() >= capacity_) room_cv_.Wait(l);
    if (stopping_) return false;
    q_.push_back(std::move(fn));
    if (idle_ == 0 && static_cast<int>(threads_.size()) < max_threads_) {
      threads_.emplace_back([this] { Loop(); });
    } else {
      work_cv_.NotifyOne();
    }
    retired.swap(retired_);
  }
  // They have left Loop (they gave up mu_ for the last time): joining takes no lock.
  for (auto& t : retired) t.join();
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
    for (auto& t : retired_) threads.push_back(std::move(t));
    retired_.clear();
  }
  for (auto& t : threads) t.join();
}

void WorkQueue::Loop() {
  MutexLock l(mu_);
  while (true) {
    while (q_.empty() && !stopping_) {
      idle_++;
      bool woken = work_cv_.WaitFor(l, idle_timeout_);
      idle_--;
      if (!woken && q_.empty() && !stopping_) {
        RetireLocked();
        return;
      }
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

void WorkQueue::RetireLocked() {
  auto self = std::this_thread::get_id();
  for (auto it = threads_.begin(); it != threads_.end(); ++it) {
    if (it->get_id() == self) {
      retired_.push_back(std::move(*it));
      threads_.erase(it);
      return;
    }
  }
}

}  // namespace torus
