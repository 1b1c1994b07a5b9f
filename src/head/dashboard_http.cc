#include "head/dashboard_http.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <mutex>
#include <set>
#include <thread>

#include "common/json_limits.h"
#include "common/resources.h"
#include "common/rpc.h"
#include "common/wire_states.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

namespace {

using Json = nlohmann::json;


// A whole-number query parameter in [0, max]; `fallback` when absent or not a number.
size_t QueryNumber(const HttpRequest& req, const std::string& name, size_t fallback, size_t max) {
  std::string v = req.Query(name);
  size_t n = fallback;
  if (!v.empty()) {
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size()) n = fallback;
  }
  return std::min(n, max);
}

Json Resources(const rpc::ResourceSet& r) {
  Json j = Json::object();
  for (const auto& [k, v] : FromProto(r)) j[k] = v.ToDouble();
  return j;
}

StatusOr<rpc::ListReply> ListAll(const DashboardSource& src) {
  rpc::ListReply reply;
  auto st = Unary<rpc::Head::Service, rpc::Head::Stub>(src.head_address, src.token, 5000, &rpc::Head::Service::List,
                                                       &rpc::Head::Stub::List, rpc::Empty(), &reply);
  if (!st.ok()) return Unavailable("the head's tables: " + st.error_message());
  return reply;
}

// rows[offset, offset+limit) of `all` as {"total", "offset", "rows"}.
HttpResponse Page(std::vector<Json> all, const HttpRequest& req) {
  size_t offset = QueryNumber(req, "offset", 0, all.size());
  size_t limit = QueryNumber(req, "limit", 100, 500);
  Json out = {{"total", all.size()}, {"offset", offset}, {"rows", Json::array()}};
  for (size_t i = offset; i < all.size() && i < offset + limit; ++i) out["rows"].push_back(std::move(all[i]));
  return HttpResponse::Json(JsonText(out));
}

HttpResponse Unavailable503(const Status& s) { return HttpResponse::Text(s.message(), 503); }

bool Contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

HttpResponse Nodes(const DashboardSource& src, const HttpRequest& req) {
  auto list = ListAll(src);
  if (!list.ok()) return Unavailable503(list.status());
  std::string q = req.Query("q");
  // The matching nodes, alive first, then by host: what a person looks for. Only the page's
  // rows become JSON (at 10,000 nodes the rest would cost more than the listing itself).
  std::vector<const rpc::NodeRecord*> match;
  match.reserve(list->nodes_size());
  for (const auto& n : list->nodes()) {
    bool ok = q.empty() || Contains(n.node_id(), q) || Contains(n.hostname(), q) || Contains(n.address(), q);
    for (auto it = n.labels().begin(); !ok && it != n.labels().end(); ++it) ok = Contains(it->first + "=" + it->second, q);
    if (ok) match.push_back(&n);
  }
  std::stable_sort(match.begin(), match.end(), [](const rpc::NodeRecord* a, const rpc::NodeRecord* b) {
    if (a->alive() != b->alive()) return a->alive();
    return a->hostname() < b->hostname();
  });
  size_t offset = QueryNumber(req, "offset", 0, match.size());
  size_t limit = QueryNumber(req, "limit", 100, 500);
  Json out = {{"total", match.size()}, {"offset", offset}, {"rows", Json::array()}};
  for (size_t i = offset; i < match.size() && i < offset + limit; ++i) {
    const auto& n = *match[i];
    Json labels = Json::object();
    for (const auto& [k, v] : n.labels()) labels[k] = v;
    out["rows"].push_back({{"node_id", n.node_id()},
                           {"address", n.address()},
                           {"hostname", n.hostname()},
                           {"alive", n.alive()},
                           {"total", Resources(n.total())},
                           {"available", Resources(n.available())},
                           {"labels", labels}});
  }
  return HttpResponse::Json(JsonText(out));
}

HttpResponse Overview(const DashboardSource& src) {
  auto list = ListAll(src);
  if (!list.ok()) return Unavailable503(list.status());
  int alive = 0;
  ResourceMap total, avail;
  for (const auto& n : list->nodes()) {
    if (!n.alive()) continue;
    ++alive;
    Add(total, FromProto(n.total()));
    Add(avail, FromProto(n.available()));
  }
  std::map<std::string, int> actors, groups;
  for (const auto& a : list->actors()) ++actors[StateName(a.state())];
  for (const auto& g : list->placement_groups()) ++groups[StateName(g.state())];
  Json out = {{"nodes_alive", alive},
              {"nodes_dead", list->nodes_size() - alive},
              {"resources_total", ToDoubles(total)},
              {"resources_available", ToDoubles(avail)},
              {"actors", actors},
              {"placement_groups", groups},
              {"drivers", list->jobs_size()}};
  return HttpResponse::Json(JsonText(out));
}

HttpResponse Slices(const DashboardSource& src) {
  rpc::SliceQueryReply reply;
  auto st = Unary<rpc::Head::Service, rpc::Head::Stub>(src.head_address, src.token, 5000,
                                                       &rpc::Head::Service::QuerySlices,
                                                       &rpc::Head::Stub::QuerySlices, rpc::SliceQueryRequest(), &reply);
  if (!st.ok()) return Unavailable503(Unavailable(st.error_message()));
  Json rows = Json::array();
  for (const auto& s : reply.slices()) {
    rows.push_back({{"name", s.name()},
                    {"pod_type", s.pod_type()},
                    {"topology", s.topology()},
                    {"hosts_alive", s.hosts_alive()},
                    {"hosts_expected", s.hosts_expected()},
                    {"state", StateName(s.state())},
                    {"holder", s.holder()},
                    {"node_ids", Json(std::vector<std::string>(s.node_ids().begin(), s.node_ids().end()))}});
  }
  return HttpResponse::Json(JsonText({{"total", rows.size()}, {"rows", rows}}));
}

HttpResponse PlacementGroups(const DashboardSource& src, const HttpRequest& req) {
  auto list = ListAll(src);
  if (!list.ok()) return Unavailable503(list.status());
  std::vector<Json> rows;
  for (const auto& g : list->placement_groups()) {
    std::set<std::string> nodes;
    for (const auto& b : g.bundles()) {
      if (!b.node_id().empty()) nodes.insert(b.node_id());
    }
    Json slice = nullptr;
    if (g.has_slice()) {
      slice = {{"topology", g.slice().topology()},
               {"accelerator", g.slice().accelerator_version()},
               {"num_slices", g.slice().num_slices()},
               {"slice_names", Json(std::vector<std::string>(g.slice_names().begin(), g.slice_names().end()))}};
    }
    rows.push_back({{"pg_id", g.pg_id()},
                    {"name", g.name()},
                    {"strategy", g.strategy()},
                    {"state", StateName(g.state())},
                    {"bundles", g.bundles_size()},
                    {"nodes", Json(std::vector<std::string>(nodes.begin(), nodes.end()))},
                    {"pending_reason", g.pending_reason()},
                    {"job_id", g.job_id()},
                    {"created_ms", g.created_ms()},
                    {"slice", slice}});
  }
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Json& a, const Json& b) { return a["created_ms"].get<int64_t>() > b["created_ms"].get<int64_t>(); });
  return Page(std::move(rows), req);
}

HttpResponse Actors(const DashboardSource& src, const HttpRequest& req) {
  auto list = ListAll(src);
  if (!list.ok()) return Unavailable503(list.status());
  std::vector<Json> rows;
  for (const auto& a : list->actors()) {
    rows.push_back({{"actor_id", a.actor_id()},
                    {"class_name", a.class_name()},
                    {"name", a.name()},
                    {"namespace", a.ray_namespace()},
                    {"state", StateName(a.state())},
                    {"node_id", a.node_id()},
                    {"pid", a.pid()},
                    {"restarts", a.num_restarts()},
                    {"death_cause", a.death_cause()}});
  }
  return Page(std::move(rows), req);
}

// The recent tasks of every live driver (asked in parallel, 1 s each), newest first.
HttpResponse Tasks(const DashboardSource& src, const HttpRequest& req) {
  auto list = ListAll(src);
  if (!list.ok()) return Unavailable503(list.status());
  size_t limit = QueryNumber(req, "limit", 200, 1000);
  bool failed_only = req.Query("failed") == "1";
  std::vector<rpc::TaskInfo> tasks;
  std::mutex mu;
  std::vector<std::thread> ts;
  for (int i = 0; i < list->jobs_size() && i < 64; ++i) {
    std::string addr = list->jobs(i).driver_address();
    if (addr.empty()) continue;
    ts.emplace_back([&, addr] {
      rpc::TaskList got;
      auto ctx = NewContext(src.token, 1000);
      if (!rpc::CoreWorker::NewStub(GetChannel(addr))->ListTasks(ctx.get(), rpc::Empty(), &got).ok()) return;
      std::lock_guard<std::mutex> lock(mu);
      for (auto& t : *got.mutable_tasks()) {
        if (!failed_only || t.state() == rpc::TaskInfo::FAILED) tasks.push_back(std::move(t));
      }
    });
  }
  for (auto& t : ts) t.join();
  std::sort(tasks.begin(), tasks.end(),
            [](const rpc::TaskInfo& a, const rpc::TaskInfo& b) { return a.submitted_ms() > b.submitted_ms(); });
  Json out = {{"total", tasks.size()}, {"rows", Json::array()}};
  for (size_t i = 0; i < tasks.size() && i < limit; ++i) {
    const auto& t = tasks[i];
    out["rows"].push_back({{"task_id", t.task_id()},
                           {"name", t.name()},
                           {"state", StateName(t.state())},
                           {"attempt", t.attempt()},
                           {"error", t.error()},
                           {"actor_id", t.actor_id()},
                           {"job_id", t.job_id()},
                           {"worker_id", t.worker_id()},
                           {"submitted_ms", t.submitted_ms()}});
  }
  return HttpResponse::Json(JsonText(out));
}

// The token from a sign-in: JSON {"token": ...} or a form body token=...
std::string GivenToken(const HttpRequest& req) {
  auto parsed = ParseJson(req.body, "the sign-in body");
  if (parsed.ok() && parsed->is_object() && parsed->contains("token") && (*parsed)["token"].is_string()) {
    return (*parsed)["token"].get<std::string>();
  }
  const std::string key = "token=";
  if (req.body.rfind(key, 0) == 0) {
    std::string v = req.body.substr(key.size());
    return v.substr(0, v.find('&'));
  }
  return "";
}

}  // namespace

void RegisterDashboardHttp(HttpServer& server, DashboardSource src) {
  using A = HttpServer::Access;
  server.Handle("GET", "/", A::kPublic, [](const HttpRequest&) {
    HttpResponse r = HttpResponse::Text(DashboardPage());
    r.content_type = "text/html; charset=utf-8";
    r.headers.emplace_back("Content-Security-Policy",
                           "default-src 'self'; script-src 'unsafe-inline' 'self'; style-src 'unsafe-inline' 'self'; "
                           "connect-src 'self' ws: wss:; img-src 'self' data:");
    return r;
  });
  server.Handle("POST", "/api/authenticate", A::kPublic, [src](const HttpRequest& req) {
    std::string given = GivenToken(req);
    if (given.empty()) return HttpResponse::Text("Unauthorized: give the cluster token", 401);
    if (!SameSecret(given, src.token)) return HttpResponse::Text("Forbidden: that is not this cluster's token", 403);
    HttpResponse r = HttpResponse::Json("{\"authenticated\": true}");
    r.headers.emplace_back("Set-Cookie", "torus_token=" + src.token + "; Path=/; HttpOnly; SameSite=Strict");
    return r;
  });
  // Public: lets the page choose between the sign-in form and the dashboard without a failed
  // request (a 401 would be a console error in the browser).
  server.Handle("GET", "/api/dashboard/session", A::kPublic, [&server](const HttpRequest& req) {
    return HttpResponse::Json(server.TokenStatus(req) == 0 ? "{\"signed_in\": true}" : "{\"signed_in\": false}");
  });
  server.Handle("POST", "/api/logout", A::kPublic, [](const HttpRequest&) {
    HttpResponse r = HttpResponse::Json("{}");
    r.headers.emplace_back("Set-Cookie", "torus_token=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    return r;
  });
  server.Handle("GET", "/api/dashboard/overview", A::kToken, [src](const HttpRequest&) { return Overview(src); });
  server.Handle("GET", "/api/dashboard/nodes", A::kToken, [src](const HttpRequest& r) { return Nodes(src, r); });
  server.Handle("GET", "/api/dashboard/slices", A::kToken, [src](const HttpRequest&) { return Slices(src); });
  server.Handle("GET", "/api/dashboard/placement_groups", A::kToken,
                [src](const HttpRequest& r) { return PlacementGroups(src, r); });
  server.Handle("GET", "/api/dashboard/actors", A::kToken, [src](const HttpRequest& r) { return Actors(src, r); });
  server.Handle("GET", "/api/dashboard/tasks", A::kToken, [src](const HttpRequest& r) { return Tasks(src, r); });
}

}  // namespace torus
