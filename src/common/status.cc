#include "common/status.h"

namespace torus {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kUnauthenticated: return "Unauthenticated";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kSliceLost: return "SliceLost";
    case StatusCode::kReleased: return "Released";
    case StatusCode::kTaskError: return "TaskError";
    case StatusCode::kWorkerDied: return "WorkerDied";
    case StatusCode::kActorDied: return "ActorDied";
    case StatusCode::kObjectLost: return "ObjectLost";
    case StatusCode::kOwnerDied: return "OwnerDied";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

}  // namespace torus
