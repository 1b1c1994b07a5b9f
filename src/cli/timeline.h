// `torus timeline [--output FILE] [--address A]`: the cluster's recent tasks and actor calls as
// Chrome trace-event JSON (core/timeline.h), written to FILE ("-" = stdout; default
// /tmp/torus-timeline-<time>.json, as `ray timeline` does).
//
// THREADS: the CLI's main thread.
#pragma once

#include "cli/flags.h"

namespace torus {

int Timeline(const Args& a);

}  // namespace torus
