// The dashboard: one HTML page served by the head (no JavaScript build step; the page is
// dashboard_page.html, compiled in as a string by CMake) and the JSON it reads, next to the Jobs REST API on the head's HTTP server.
//
//   GET  /                          the page (public: it shows a sign-in form until signed in)
//   POST /api/authenticate          {"token": "..."} (or a form field token=...): the right token
//                                   sets the HttpOnly, SameSite=Strict cookie `torus_token` that
//                                   every other endpoint accepts; a wrong one is 403
//   POST /api/logout                clears the cookie
//   GET  /api/dashboard/session     {"signed_in": bool} (public)
//   GET  /api/dashboard/overview    nodes alive/dead, cluster resources, counts
//   GET  /api/dashboard/nodes       ?offset=&limit=(<= 500)&q= (substring of id, host or a label)
//   GET  /api/dashboard/slices      TPU slices: topology, hosts, holder, state
//   GET  /api/dashboard/placement_groups, /api/dashboard/actors   ?offset=&limit=
//   GET  /api/dashboard/tasks       ?limit=(<= 1000)&failed=1: recent tasks of the live drivers
// Jobs and their logs come from the Jobs REST API (jobs_http.h): the list, and the log tail
// websocket for a job's live log. Serve's applications, deployments and replicas come from
// Serve's REST API (serve_http.h: GET /api/serve/applications/, the controller's details).
//
// Every table is paged on the server, so the page stays fast with 10,000 nodes: one request
// reads the head's tables once (Head.List in-process) and returns one page.
//
// THREADS: handlers run on the HTTP server's threads; they call the head's own service through
// the in-process path (common/rpc.h Unary) and drivers over gRPC (≤ 1 s each).
#pragma once

#include <string>

#include "common/http_server.h"

namespace torus {

struct DashboardSource {
  std::string head_address;  // the head's own service, called in-process
  std::string token;
};

// Registers the routes above on `server` (before its Start; `server` outlives its handlers).
void RegisterDashboardHttp(HttpServer& server, DashboardSource src);

// The page (dashboard_page.html, generated into dashboard_page.cc by CMake).
const std::string& DashboardPage();

}  // namespace torus
