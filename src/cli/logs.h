// `torus logs`: read a node's or a worker's log file from anywhere in the cluster, through that
// node (Node.ListLogs / Node.ReadLog; docs/observability.md). As `ray logs` does:
//
//   torus logs                          every live node's log files
//   torus logs NODE                     one node's files (NODE: id prefix, address, host name,
//                                       or its launcher name, e.g. v6e-0-1 for node-v6e-0-1.out)
//   torus logs [NODE] FILE              print a file (a glob; without NODE it must match on one node)
//   torus logs --worker ID | --actor ID a worker's stdout (--err: its stderr)
//   ... [--tail N (1000; -1 = all)] [--follow] [--address A]
//
// --follow prints what is appended until interrupted (a file that shrinks is read again from its
// start, said on stderr). THREADS: the CLI's main thread (listings ask the nodes in parallel).
#pragma once

#include "cli/flags.h"

namespace torus {

int Logs(const Args& a);

}  // namespace torus
