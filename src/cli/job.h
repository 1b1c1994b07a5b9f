// `torus job ...` (src/cli/job.cc, docs/cli.md): submit, status, logs, stop, list.
#pragma once

namespace torus {

// argv[1] is "job". Returns the process exit code.
int RunJobCommand(int argc, char** argv);

}  // namespace torus
