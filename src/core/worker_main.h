// Worker mode: the process was started by a node to run tasks (TORUS_WORKER_MODE=1, either the
// driver's own executable re-entering through ray::Init(), or `torus worker` with a code search
// path of shared libraries). Connects to the node and serves tasks until told to exit.
#pragma once

namespace torus {

[[noreturn]] void RunWorkerMain();

}  // namespace torus
