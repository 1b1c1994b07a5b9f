#include "head/jobs_http.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <charconv>
#include <cmath>
#include <memory>

#include "common/json_limits.h"
#include "common/resources.h"
#include "common/rpc.h"
#include "common/wire_states.h"

namespace torus {

namespace {

using Json = nlohmann::json;

constexpr const char* kRayVersion = "2.60.0";  // the Ray release whose Jobs API this speaks
constexpr size_t kMaxLogBytes = 64u << 20;     // one /logs answer (the start of a longer log)
constexpr size_t kTailChunk = 256u << 10;      // one websocket message (aiohttp takes <= 4 MiB)
constexpr int kMaxTails = 24;                  // of the server's 64 websocket threads


HttpResponse Error(const Status& s) {
  int code = 500;
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kAlreadyExists:
    case StatusCode::kFailedPrecondition: code = 400; break;
    case StatusCode::kNotFound: code = 404; break;
    case StatusCode::kUnavailable: code = 503; break;
    default: break;
  }
  return HttpResponse::Text(s.message(), code);
}

HttpResponse NoJob(const std::string& id) { return HttpResponse::Text("Job " + id + " does not exist", 404); }

// argv as one shell command line (how `torus job submit -- ARGS` jobs show in Ray's listing).
std::string ShellJoin(const rpc::JobRecord& r) {
  std::string out;
  for (const auto& a : r.entrypoint()) {
    if (!out.empty()) out += ' ';
    bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                   "0123456789_-./=:,+@%") == std::string::npos;
    if (plain) {
      out += a;
      continue;
    }
    out += '\'';
    for (char c : a) out += c == '\'' ? std::string("'\"'\"'") : std::string(1, c);
    out += '\'';
  }
  return out;
}


std::string DefaultMessage(const rpc::JobRecord& r) {
  switch (r.state()) {
    case rpc::JobRecord::PENDING: return "Job has not started yet.";
    case rpc::JobRecord::RUNNING: return "Job is currently running.";
    case rpc::JobRecord::SUCCEEDED: return "Job finished successfully.";
    case rpc::JobRecord::STOPPED: return "Job was intentionally stopped.";
    default: return "Job failed.";
  }
}

// A record as Ray's JobDetails (all of its fields, null when unset) plus Torus's own under
// "torus", which Ray's clients ignore.
Json Details(const rpc::JobRecord& r) {
  Json j;
  j["type"] = "SUBMISSION";
  j["job_id"] = r.job_id();
  j["submission_id"] = r.job_id();
  const rpc::JobProcessInfo* driver = r.processes_size() > 0 ? &r.processes(0) : nullptr;
  if (driver && driver->pid() > 0) {
    j["driver_info"] = {{"id", r.job_id()},
                        {"node_ip_address", HostOf(driver->node_address())},
                        {"pid", std::to_string(driver->pid())}};
  } else {
    j["driver_info"] = nullptr;
  }
  j["status"] = StateName(r.state());
  j["entrypoint"] = r.shell_command().empty() ? ShellJoin(r) : r.shell_command();
  j["message"] = r.message().empty() ? DefaultMessage(r) : r.message();
  if (r.state() == rpc::JobRecord::FAILED) {
    j["error_type"] = r.exit_code() > 0 ? "JOB_ENTRYPOINT_COMMAND_ERROR" : "JOB_ENTRYPOINT_COMMAND_START_ERROR";
  } else {
    j["error_type"] = nullptr;
  }
  j["start_time"] = r.submitted_ms();
  j["end_time"] = r.end_ms() > 0 ? Json(r.end_ms()) : Json(nullptr);
  j["metadata"] = Json::object();
  for (const auto& [k, v] : r.metadata()) j["metadata"][k] = v;
  Json env = Json::object();
  if (!r.runtime_env_json().empty()) {
    auto parsed = ParseJson(r.runtime_env_json(), "a job's runtime_env");
    if (parsed.ok()) env = std::move(*parsed);
  }
  j["runtime_env"] = env;
  j["driver_agent_http_address"] = nullptr;
  j["driver_node_id"] = driver ? Json(driver->node_id()) : Json(nullptr);
  j["driver_exit_code"] = IsTerminal(r.state()) && r.exit_code() >= 0 ? Json(r.exit_code()) : Json(nullptr);
  Json t;
  t["attempt"] = r.attempt();
  t["max_retries"] = r.max_retries();
  t["started_ms"] = r.start_ms() > 0 ? Json(r.start_ms()) : Json(nullptr);
  if (!r.slice_topology().empty()) {
    t["slice"] = {{"topology", r.slice_topology()},
                  {"accelerator", r.accelerator_version()},
                  {"num_slices", r.num_slices()},
                  {"slice_names", Json(std::vector<std::string>(r.slice_names().begin(), r.slice_names().end()))}};
  }
  t["processes"] = Json::array();
  for (const auto& p : r.processes()) {
    t["processes"].push_back({{"rank", p.rank()},
                              {"host", p.host()},
                              {"node_id", p.node_id()},
                              {"pid", p.pid()},
                              {"state", StateName(p.state())}});
  }
  j["torus"] = t;
  return j;
}

StatusOr<std::map<std::string, std::string>> StringMap(const Json& v, const std::string& what) {
  std::map<std::string, std::string> out;
  if (v.is_null()) return out;
  if (!v.is_object()) return InvalidArgument(what + " must be an object of strings");
  for (const auto& [k, x] : v.items()) {
    if (!x.is_string()) return InvalidArgument(what + "['" + k + "'] must be a string");
    out[k] = x.get<std::string>();
  }
  return out;
}

Status SetDriverAmount(rpc::JobSubmitRequest& req, const std::string& name, const Json& v, const std::string& what) {
  if (v.is_null()) return Status::Ok();
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
    return InvalidArgument(what + " must be a number >= 0");
  }
  if (v.get<double>() > MaxResourceAmount(name)) {
    return InvalidArgument(what + " must be at most " + Json(MaxResourceAmount(name)).dump());
  }
  if (v.get<double>() > 0) (*req.mutable_driver_resources()->mutable_units())[name] = ResourceAmount(v.get<double>()).units();
  return Status::Ok();
}

StatusOr<int64_t> MetadataInt(const std::map<std::string, std::string>& md, const std::string& key, int64_t max) {
  auto it = md.find(key);
  if (it == md.end()) return int64_t{0};
  const std::string& v = it->second;
  int64_t n = -1;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size() || n < 0 || n > max) {
    return InvalidArgument("metadata['" + key + "'] must be a whole number from 0 to " + std::to_string(max) +
                           ", not '" + v + "'");
  }
  return n;
}

// The runtime_env Torus takes: env_vars and a working_dir that is a path on the driver's host.
Status ReadRuntimeEnv(const Json& env, rpc::JobSubmitRequest& req) {
  if (env.is_null()) return Status::Ok();
  if (!env.is_object()) return InvalidArgument("runtime_env must be an object");
  for (const auto& [k, v] : env.items()) {
    if (k == "env_vars") {
      auto vars = StringMap(v, "runtime_env['env_vars']");
      if (!vars.ok()) return vars.status();
      for (auto& [name, value] : *vars) {
        if (name.empty() || name.find_first_of(std::string("=\0", 2)) != std::string::npos ||
            value.find('\0') != std::string::npos) {
          return InvalidArgument("runtime_env['env_vars']: '" + name + "' is not a valid environment variable");
        }
        (*req.mutable_env_vars())[name] = value;
      }
    } else if (k == "working_dir") {
      if (!v.is_string()) return InvalidArgument("runtime_env['working_dir'] must be a string");
      std::string dir = v.get<std::string>();
      if (dir.find("://") != std::string::npos || dir.empty() || dir[0] != '/') {
        return InvalidArgument("runtime_env['working_dir'] '" + dir +
                               "': Torus takes a directory path on the driver's host (an absolute path); "
                               "uploaded working directories are not supported");
      }
      req.set_working_dir(dir);
    } else if (k == "_ray_commit" || k == "config") {
      // Ray's client adds these; nothing to do
    } else {
      return InvalidArgument("runtime_env['" + k +
                             "'] is not supported by Torus (it takes env_vars and a working_dir path); "
                             "install what the job needs on the hosts");
    }
  }
  req.set_runtime_env_json(JsonText(env));
  return Status::Ok();
}

// A submission's JSON body as a JobManager request; InvalidArgument names what is wrong.
StatusOr<rpc::JobSubmitRequest> ParseSubmit(const std::string& body) {
  auto parsed = ParseJson(body, "the request body");  // bounded depth: nothing below recurses deeper
  if (!parsed.ok()) return parsed.status();
  Json j = std::move(*parsed);
  if (!j.is_object()) return InvalidArgument("the request body must be a JSON object");
  rpc::JobSubmitRequest req;
  for (const auto& [k, v] : j.items()) {
    static const std::set<std::string> known = {
        "entrypoint", "submission_id", "job_id", "runtime_env", "metadata", "entrypoint_num_cpus",
        "entrypoint_num_gpus", "entrypoint_memory", "entrypoint_resources", "entrypoint_label_selector"};
    if (!known.count(k)) return InvalidArgument("unknown field '" + k + "' in the job submission");
  }
  if (!j.contains("entrypoint") || !j["entrypoint"].is_string() || j["entrypoint"].get<std::string>().empty()) {
    return InvalidArgument("'entrypoint' (a shell command line) is required");
  }
  req.set_shell_command(j["entrypoint"].get<std::string>());
  for (const char* key : {"submission_id", "job_id"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_string()) return InvalidArgument(std::string("'") + key + "' must be a string");
    if (req.submission_id().empty()) req.set_submission_id(j[key].get<std::string>());
  }
  if (auto s = ReadRuntimeEnv(j.value("runtime_env", Json()), req); !s.ok()) return s;
  auto md = StringMap(j.value("metadata", Json()), "metadata");
  if (!md.ok()) return md.status();
  for (const auto& [k, v] : *md) (*req.mutable_metadata())[k] = v;
  if (auto s = SetDriverAmount(req, "CPU", j.value("entrypoint_num_cpus", Json()), "entrypoint_num_cpus"); !s.ok()) return s;
  if (auto s = SetDriverAmount(req, "GPU", j.value("entrypoint_num_gpus", Json()), "entrypoint_num_gpus"); !s.ok()) return s;
  if (auto s = SetDriverAmount(req, "memory", j.value("entrypoint_memory", Json()), "entrypoint_memory"); !s.ok()) return s;
  Json res = j.value("entrypoint_resources", Json());
  if (!res.is_null() && !res.is_object()) return InvalidArgument("entrypoint_resources must be an object of numbers");
  if (res.is_object()) {
    for (const auto& [name, amount] : res.items()) {
      if (auto s = SetDriverAmount(req, name, amount, "entrypoint_resources['" + name + "']"); !s.ok()) return s;
    }
  }
  auto sel = StringMap(j.value("entrypoint_label_selector", Json()), "entrypoint_label_selector");
  if (!sel.ok()) return sel.status();
  for (const auto& [k, v] : *sel) (*req.mutable_driver_label_selector())[k] = v;
  // Torus's slice jobs.
  auto get = [&](const std::string& k) { return md->count(k) ? md->at(k) : std::string(); };
  req.set_slice_topology(get("torus.slice"));
  req.set_accelerator_version(get("torus.accelerator"));
  auto num_slices = MetadataInt(*md, "torus.num_slices", 1024);
  auto retries = MetadataInt(*md, "torus.max_retries", 1000);
  auto wait_s = MetadataInt(*md, "torus.slice_wait_timeout_s", 365LL * 24 * 3600);
  for (const auto* n : {&num_slices, &retries, &wait_s}) {
    if (!n->ok()) return n->status();
  }
  req.set_num_slices(static_cast<int32_t>(*num_slices));
  req.set_max_retries(static_cast<int32_t>(*retries));
  req.set_slice_wait_timeout_ms(*wait_s * 1000);
  return req;
}

// The valid UTF-8 prefix of `pending` (invalid bytes replaced by U+FFFD), leaving an incomplete
// sequence at its end in `pending` unless `final`: websocket text messages must be UTF-8.
std::string TakeUtf8(std::string& pending, bool final) {
  std::string out;
  out.reserve(pending.size());
  size_t i = 0;
  const size_t n = pending.size();
  while (i < n) {
    auto c = static_cast<unsigned char>(pending[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    if (i + len > n) {
      bool prefix_ok = true;
      for (size_t k = i + 1; k < n; ++k) prefix_ok = prefix_ok && (static_cast<unsigned char>(pending[k]) >> 6) == 2;
      if (!final && prefix_ok) break;  // the rest arrives with the next read
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    bool ok = true;
    for (size_t k = 1; k < len; ++k) ok = ok && (static_cast<unsigned char>(pending[i + k]) >> 6) == 2;
    if (ok && len == 3) {
      unsigned cp = ((c & 0x0F) << 12) | ((static_cast<unsigned char>(pending[i + 1]) & 0x3F) << 6);
      ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);
    } else if (ok && len == 2) {
      ok = c >= 0xC2;
    } else if (ok && len == 4) {
      unsigned cp = ((c & 0x07) << 18) | ((static_cast<unsigned char>(pending[i + 1]) & 0x3F) << 12);
      ok = cp >= 0x10000 && cp <= 0x10FFFF;
    }
    if (!ok) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    out.append(pending, i, len);
    i += len;
  }
  pending.erase(0, i);
  return out;
}

void TailLog(JobManager& jobs, const std::string& id, WebSocketOut& out) {
  uint64_t offset = 0;
  std::string pending;
  while (out.open() && !jobs.stopping()) {
    auto got = jobs.ReadLog(id, offset, kTailChunk);
    if (!got.ok()) return;  // deleted meanwhile
    offset += got->data.size();
    bool done = got->data.empty() && IsTerminal(got->job.state());
    pending += got->data;
    std::string text = TakeUtf8(pending, done);
    if (!text.empty() && !out.SendText(text)) return;
    if (done) return;  // the server closes with 1000
    if (got->data.empty()) {
      jobs.WaitForChange(std::chrono::milliseconds(250));
      if (!out.Idle(std::chrono::milliseconds(0))) return;  // pings a quiet peer: gone ones end here
    }
  }
}

}  // namespace

void RegisterJobsHttp(HttpServer& server, JobManager& jobs, JobsHttpInfo info) {
  using A = HttpServer::Access;
  // /api/ray/version: the same answer, where Ray's Serve CLI (ServeSubmissionClient) checks it.
  for (const char* path : {"/api/version", "/api/ray/version"}) {
    server.Handle("GET", path, A::kToken, [info](const HttpRequest&) {
      Json j = {{"version", "4"},
                {"ray_version", kRayVersion},
                {"ray_commit", "torus"},
                {"session_name", info.session_name},
                {"torus_version", TORUS_VERSION}};
      return HttpResponse::Json(JsonText(j));
    });
  }
  server.Handle("POST", "/api/jobs/", A::kToken, [&jobs](const HttpRequest& req) {
    auto parsed = ParseSubmit(req.body);
    if (!parsed.ok()) return Error(parsed.status());
    auto rec = jobs.Submit(*parsed);
    if (!rec.ok()) return Error(rec.status());
    return HttpResponse::Json(JsonText({{"job_id", rec->job_id()}, {"submission_id", rec->job_id()}}));
  });
  server.Handle("GET", "/api/jobs/", A::kToken, [&jobs](const HttpRequest&) {
    Json list = Json::array();
    for (const auto& r : jobs.List()) list.push_back(Details(r));
    return HttpResponse::Json(JsonText(list));
  });
  server.Handle("GET", "/api/jobs/{}", A::kToken, [&jobs](const HttpRequest& req) {
    auto rec = jobs.Get(req.params[0]);
    if (!rec.ok()) return NoJob(req.params[0]);
    return HttpResponse::Json(JsonText(Details(*rec)));
  });
  server.Handle("GET", "/api/jobs/{}/logs", A::kToken, [&jobs](const HttpRequest& req) {
    auto got = jobs.ReadLog(req.params[0], 0, kMaxLogBytes);
    if (!got.ok()) return NoJob(req.params[0]);
    return HttpResponse::Json(JsonText({{"logs", got->data}}));
  });
  server.Handle("POST", "/api/jobs/{}/stop", A::kToken, [&jobs](const HttpRequest& req) {
    auto rec = jobs.RequestStop(req.params[0]);
    if (!rec.ok()) return NoJob(req.params[0]);
    return HttpResponse::Json(JsonText({{"stopped", !IsTerminal(rec->state())}}));
  });
  server.Handle("DELETE", "/api/jobs/{}", A::kToken, [&jobs](const HttpRequest& req) {
    auto s = jobs.Delete(req.params[0]);
    if (s.code() == StatusCode::kNotFound) return NoJob(req.params[0]);
    if (!s.ok()) return Error(s);
    return HttpResponse::Json(JsonText({{"deleted", true}}));
  });
  // A tail holds a thread of its own while it is open: at most kMaxTails at once.
  auto tails = std::make_shared<std::atomic<int>>(0);
  server.HandleWebSocket(
      "/api/jobs/{}/logs/tail", A::kToken,
      [&jobs, tails](const HttpRequest& req, WebSocketOut& out) {
        ++*tails;
        TailLog(jobs, req.params[0], out);
        --*tails;
      },
      [&jobs, tails](const HttpRequest& req) -> std::optional<HttpResponse> {
        if (!jobs.Get(req.params[0]).ok()) return NoJob(req.params[0]);
        if (*tails >= kMaxTails) {
          return HttpResponse::Text("too many log tails are open (" + std::to_string(kMaxTails) +
                                        "); try again when one has closed",
                                    503);
        }
        return std::nullopt;
      });
  // Ray's client uploads a local working_dir here first: refused with the reason.
  for (const char* method : {"GET", "PUT"}) {
    server.Handle(method, "/api/packages/{}/{}", A::kToken, [](const HttpRequest&) {
      return HttpResponse::Text(
          "Torus does not take uploaded working directories or py_modules: give runtime_env "
          "working_dir as a directory path on the driver's host, or put the code in the image",
          501);
    });
  }
}

}  // namespace torus
