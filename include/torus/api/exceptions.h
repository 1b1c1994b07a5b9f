// The exceptions the user API promises. The core library throws these from Get, Wait and task
// submission; user code catches them by the Ray spellings (ray::internal::RayTaskException, ...).
//
// Every class keeps Ray's shape: it derives from RayException, is constructed from a message,
// and exposes that message as the public member `msg_` (Ray programs read it directly).
#pragma once

#include <exception>
#include <string>

namespace torus::internal {

// Base of every error the API reports.
class RayException : public std::exception {
 public:
  RayException(const std::string& msg) : msg_(msg) {}  // NOLINT: implicit, as in Ray
  const char* what() const noexcept override { return msg_.c_str(); }

  std::string msg_;
};

// The actor died (or could not be created) before or while running the call.
class RayActorException : public RayException {
 public:
  using RayException::RayException;
};

// The remote function or method threw; the message carries the original error.
class RayTaskException : public RayException {
 public:
  using RayException::RayException;
};

// The worker process running the task died and retries were exhausted.
class RayWorkerException : public RayException {
 public:
  using RayException::RayException;
};

// The object was lost and cannot be rebuilt (its owner is gone, or lineage is unavailable).
class UnreconstructableException : public RayException {
 public:
  using RayException::RayException;
};

// Torus extension: the object's owner (the process that created it) is gone, and the object with
// it (Ray's OwnerDiedError). Caught as UnreconstructableException too.
class OwnerDiedException : public UnreconstructableException {
 public:
  using UnreconstructableException::UnreconstructableException;
};

// A function or method was used remotely without having been registered with RAY_REMOTE.
class RayFunctionNotFound : public RayException {
 public:
  using RayException::RayException;
};

// A RuntimeEnv field is missing, malformed, or of another type than asked for.
class RayRuntimeEnvException : public RayException {
 public:
  using RayException::RayException;
};

// Torus extension: a host of the TPU slice reserved for this work was lost (docs/tpu.md
// section 6 "Failure"); the message names the slice, slice index, lost node and epoch.
class RaySliceLostException : public RayException {
 public:
  explicit RaySliceLostException(const std::string& msg) : RayException(msg) {}
};

// Get gave up after its timeout_ms.
class RayTimeoutException : public RayException {
 public:
  using RayException::RayException;
};

// Torus extension: an argument of the call was invalid (a malformed topology, resource amount,
// label selector or option) and nothing was submitted. Python raises it as ValueError, as Ray
// does for the same mistakes.
class RayInvalidArgumentException : public RayException {
 public:
  using RayException::RayException;
};

// Torus extension: the task was cancelled (Runtime::Cancel) before it produced its value.
class TaskCancelledException : public RayException {
 public:
  using RayException::RayException;
};

}  // namespace torus::internal
