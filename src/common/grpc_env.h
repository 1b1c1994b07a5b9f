// gRPC settings Torus makes for its own processes through the environment (gRPC reads them once,
// when it initialises): host names resolve through glibc (GRPC_DNS_RESOLVER=native), so
// /etc/hosts and nsswitch count, as everywhere else on the host and as Ray resolves a head's
// name. A value the user set wins and is left alone. Children (workers, job entrypoints, user
// programs) must not inherit what Torus set for itself: Spawn (common/process.h) removes it.
//
// Threading: the variables are set during static initialisation, before any thread of ours
// runs; GrpcEnvSetHere is read-only afterwards; ForgetGrpcEnv runs its work once.
#pragma once

#include <string>
#include <vector>

namespace torus {

// The environment variables this process set for its own gRPC (not the user's).
const std::vector<std::string>& GrpcEnvSetHere();

// Called once gRPC has read its configuration (after the first channel is made): removes the
// variables set here from this process's environment, so that programs a user starts from it
// (a driver's or a task's subprocesses) do not inherit them. The first call acts; later calls
// return at once. Thread-safe.
void ForgetGrpcEnv();

}  // namespace torus
