// Ray's Jobs REST API (the one `ray job --address http://HEAD:8265` and Ray's
// JobSubmissionClient speak, Ray 2.60) over the head's JobManager: the same jobs as
// `torus job`. docs/http.md lists the endpoints; this file only translates JSON to the
// JobManager's calls and records back to Ray's JobDetails.
//
//   GET    /api/version                 {"version": "4", "ray_version": ..., ...}
//   GET    /api/ray/version             the same (where Ray's Serve CLI asks)
//   POST   /api/jobs/                   submit: {"job_id", "submission_id"}
//   GET    /api/jobs/                   [JobDetails...]
//   GET    /api/jobs/{id}               JobDetails (404 unknown)
//   GET    /api/jobs/{id}/logs          {"logs": "..."}
//   GET    /api/jobs/{id}/logs/tail     websocket: the log as text messages from the start, closed
//                                       (1000) once the job is finished and all of it was sent
//   POST   /api/jobs/{id}/stop          {"stopped": bool}
//   DELETE /api/jobs/{id}               {"deleted": bool} (400 for a job not finished)
//
// A submission's entrypoint is a shell command line (run by /bin/sh -c). runtime_env takes
// env_vars and a working_dir that is a directory on the driver's host; other runtime_env
// fields (pip, conda, uploaded packages, ...) are refused with 400 naming them. entrypoint
// num_cpus/num_gpus/memory/resources/label_selector choose the driver's node. A slice job (one
// process on every host of whole TPU slices, as `torus job submit --slice`) is asked for with
// metadata keys Ray has no field for: "torus.slice" (topology), "torus.accelerator",
// "torus.num_slices", "torus.max_retries", "torus.slice_wait_timeout_s".
//
// THREADS: the handlers run on the HTTP server's threads and only call JobManager (thread-safe).
#pragma once

#include <string>

#include "common/http_server.h"
#include "head/jobs.h"

namespace torus {

struct JobsHttpInfo {
  std::string session_name;  // reported by /api/version
};

// Registers the routes above on `server` (before its Start); every one needs the token.
// `jobs` outlives the server's serving.
void RegisterJobsHttp(HttpServer& server, JobManager& jobs, JobsHttpInfo info);

}  // namespace torus
