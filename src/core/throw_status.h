// ThrowStatus: how the core worker's API calls turn a failed Status (or a head reply's error)
// into the exception the user API promises. InvalidArgument becomes RayInvalidArgumentException
// (Python: ValueError); every other code RayException. One place decides, so a new code is
// mapped once.
//
// THREADS: none (pure).
#pragma once

#include <string>

#include "common/status.h"
#include "proto/torus.pb.h"
#include "torus/api/exceptions.h"

namespace torus::core {

// Throws `s` (not OK), its message prefixed by `context` ("cannot create actor: ...").
[[noreturn]] inline void ThrowStatus(const Status& s, const std::string& context = "") {
  std::string msg = context + s.message();
  if (s.code() == StatusCode::kInvalidArgument) throw internal::RayInvalidArgumentException(msg);
  throw internal::RayException(msg);
}

// The same for a wire error (rpc::Error, code a StatusCode).
[[noreturn]] inline void ThrowStatus(const rpc::Error& e, const std::string& context = "") {
  ThrowStatus(Status(static_cast<StatusCode>(e.code()), e.message()), context);
}

}  // namespace torus::core
