// Thread-safety annotations, checked by clang's -Wthread-safety (the `tsa` stage of .ci/run);
// with g++ they compile to nothing.
//
// Contract: a member written `T x GUARDED_BY(mu_);` is only read or written while `mu_` (a
// torus::Mutex) is held; a method marked `REQUIRES(mu_)` is only called with it held, one marked
// `EXCLUDES(mu_)` only without. Lock with `MutexLock l(mu_);` (a scoped capability clang can
// follow); wait with `CondVar::Wait(l)` in a `while (!condition)` loop, not with a predicate
// lambda (clang cannot see that a lambda runs under the lock).
//
// Threading: Mutex and CondVar are what std::mutex and std::condition_variable are; they add
// no cost beyond them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define TORUS_TSA(x) __attribute__((x))
#else
#define TORUS_TSA(x)
#endif

// absl (included by gRPC) defines some of these names with the same meaning: ours win, so
// that the include order does not matter.
#undef CAPABILITY
#undef SCOPED_CAPABILITY
#undef GUARDED_BY
#undef PT_GUARDED_BY
#undef ACQUIRED_BEFORE
#undef ACQUIRED_AFTER
#undef REQUIRES
#undef ACQUIRE
#undef RELEASE
#undef TRY_ACQUIRE
#undef EXCLUDES
#undef ASSERT_CAPABILITY
#undef RETURN_CAPABILITY
#undef NO_THREAD_SAFETY_ANALYSIS

#define CAPABILITY(x) TORUS_TSA(capability(x))
#define SCOPED_CAPABILITY TORUS_TSA(scoped_lockable)
#define GUARDED_BY(x) TORUS_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) TORUS_TSA(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) TORUS_TSA(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) TORUS_TSA(acquired_after(__VA_ARGS__))
#define REQUIRES(...) TORUS_TSA(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) TORUS_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) TORUS_TSA(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) TORUS_TSA(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) TORUS_TSA(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) TORUS_TSA(assert_capability(x))
#define RETURN_CAPABILITY(x) TORUS_TSA(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS TORUS_TSA(no_thread_safety_analysis)

namespace torus {

class CondVar;
class MutexLock;

// A std::mutex that clang's analysis knows as a capability.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // For code that proves the lock is held in a way clang cannot follow.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope; Unlock()/Lock() in between are allowed.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() { lock_.unlock(); }
  void Lock() ACQUIRE() { lock_.lock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

// A condition variable waited on with a MutexLock held.
class CondVar {
 public:
  void Wait(MutexLock& l) { cv_.wait(l.lock_); }
  // False on timeout.
  template <typename Rep, typename Period>
  bool WaitFor(MutexLock& l, std::chrono::duration<Rep, Period> d) {
    return cv_.wait_for(l.lock_, d) == std::cv_status::no_timeout;
  }
  template <typename Clock, typename Duration>
  bool WaitUntil(MutexLock& l, std::chrono::time_point<Clock, Duration> t) {
    return cv_.wait_until(l.lock_, t) == std::cv_status::no_timeout;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace torus
