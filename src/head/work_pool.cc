#include "head/work_pool.h"

namespace torus {

WorkPool::WorkPool(size_t max_threads) : max_threads_(max_threads < 1 ? 1 : max_threads) {}

WorkPool::~WorkPool() { Stop(); }

bool WorkPool::Submit(std::function<void()> job) {
  MutexLock lock(mu_);
  if (stopping_) return false;
  queue_.push_back(std::move(job));
  if (idle_ >= queue_.size() || threads_.size() >= max_threads_) {
    cv_.NotifyOne();
  } else {
    threads_.emplace_back([this] { Work(); });
  }
  return true;
}

void WorkPool::Stop() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    cv_.NotifyAll();
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
}

size_t WorkPool::threads() const {
  MutexLock lock(mu_);
  return threads_.size();
}

void WorkPool::Work() {
  MutexLock lock(mu_);
  while (true) {
    while (queue_.empty() && !stopping_) {
      ++idle_;
      cv_.Wait(lock);
      --idle_;
    }
    if (queue_.empty()) return;  // stopping, and nothing left to drain
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    lock.Unlock();
    job();
    job = nullptr;  // its captures die outside the lock too
    lock.Lock();
  }
}

}  // namespace torus
