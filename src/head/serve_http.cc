#include "head/serve_http.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <charconv>
#include <map>
#include <thread>

#include "common/ids.h"
#include "common/json_limits.h"
#include "common/logging.h"
#include "common/wire_states.h"
#include "head/actors.h"
#include "head/jobs.h"
#include "head/serve_metrics.h"

namespace torus {

namespace {

using Json = nlohmann::json;

constexpr const char* kConfigKey = "deploy_config";
constexpr const char* kVersionKey = "deploy_config_version";
constexpr const char* kDetailsKey = "details";
constexpr const char* kBootstrapMetadata = "torus.serve";  // = "rest_bootstrap" on its jobs
constexpr const char* kShutdownConfig = R"({"_shutdown":true,"applications":[]})";


// Ray's rule (ServeApplicationSchema.import_path): "module:attribute" with one colon, or
// "module.attribute" with the last dot splitting them; neither side empty.
bool ImportPathOk(const std::string& p) {
  if (p.empty() || p.find_first_of(" \t\r\n") != std::string::npos) return false;
  size_t colon = p.find(':');
  if (colon != std::string::npos) {
    return p.find(':', colon + 1) == std::string::npos && colon > 0 && colon + 1 < p.size();
  }
  size_t dot = p.rfind('.');
  return dot != std::string::npos && dot > 0 && dot + 1 < p.size();
}

Status CheckApplication(const Json& app, const std::string& where) {
  if (!app.is_object()) return InvalidArgument(where + " must be an object");
  auto it = app.find("import_path");
  if (it == app.end() || !it->is_string() || !ImportPathOk(it->get<std::string>())) {
    std::string got = it == app.end() ? "missing" : "got " + JsonText(*it);
    if (got.size() > 200) got = got.substr(0, 200) + "...";
    return InvalidArgument(where + ".import_path must be a non-empty string \"module:attribute\" (" + got + ")");
  }
  if (auto n = app.find("name"); n != app.end() && !(n->is_string() && !n->get<std::string>().empty())) {
    return InvalidArgument(where + ".name must be a non-empty string");
  }
  if (auto r = app.find("route_prefix"); r != app.end() && !r->is_null()) {
    const std::string p = r->is_string() ? r->get<std::string>() : "";
    if (p.empty() || p[0] != '/' || (p != "/" && p.back() == '/') || p.find_first_of("{}") != std::string::npos) {
      return InvalidArgument(where + ".route_prefix must be null or a path starting with '/' (not ending in '/' "
                                     "unless it is \"/\", no '{' '}'), not " + JsonText(*r));
    }
  }
  for (const char* key : {"args", "runtime_env"}) {
    if (auto v = app.find(key); v != app.end() && !v->is_null() && !v->is_object()) {
      return InvalidArgument(where + "." + key + " must be an object");
    }
  }
  if (auto d = app.find("deployments"); d != app.end() && !d->is_null()) {
    if (!d->is_array()) return InvalidArgument(where + ".deployments must be a list of objects");
    for (size_t i = 0; i < d->size(); ++i) {
      if (!(*d)[i].is_object()) {
        return InvalidArgument(where + ".deployments[" + std::to_string(i) + "] must be an object");
      }
    }
  }
  return Status::Ok();
}

// The version after `current` (absent or garbled: 0).
std::string NextVersion(const std::optional<std::string>& current) {
  uint64_t v = 0;
  if (current) {
    auto [end, ec] = std::from_chars(current->data(), current->data() + current->size(), v);
    if (ec != std::errc() || end != current->data() + current->size()) {
      TORUS_LOG(WARNING) << "serve: " << kVersionKey << " in the KV store is not a number ('" << *current
                         << "'); counting from 0";
      v = 0;
    }
  }
  return std::to_string(v + 1);
}

HttpResponse ErrorResponse(const Status& s) {
  int code = s.code() == StatusCode::kInvalidArgument ? 400 : s.code() == StatusCode::kUnavailable ? 503 : 500;
  return HttpResponse::Text(s.message(), code);
}

class HeadServeRuntime final : public ServeRuntime {
 public:
  HeadServeRuntime(ActorDirectory& actors, JobManager& jobs, const std::atomic<bool>& stopping)
      : actors_(actors), jobs_(jobs), stopping_(stopping) {}

  bool ControllerLive() override { return actors_.FindNamed(kServeNamespace, kServeControllerName).has_value(); }

  bool BootstrapRunning() override {
    for (const auto& r : jobs_.List()) {
      auto it = r.metadata().find(kBootstrapMetadata);
      if (it != r.metadata().end() && it->second == "rest_bootstrap" && !IsTerminal(r.state())) return true;
    }
    return false;
  }

  Status StartBootstrap(const std::string& shell_command) override {
    rpc::JobSubmitRequest req;
    req.set_shell_command(shell_command);
    req.set_submission_id("serve-bootstrap-" + RandomHex(5));
    (*req.mutable_metadata())[kBootstrapMetadata] = "rest_bootstrap";
    auto rec = jobs_.Submit(req);
    if (!rec.ok()) return rec.status();
    TORUS_LOG(INFO) << "serve: no controller is alive; job " << rec->job_id() << " starts Serve";
    return Status::Ok();
  }

  bool Stopping() override { return stopping_; }

 private:
  ActorDirectory& actors_;
  JobManager& jobs_;
  const std::atomic<bool>& stopping_;
};

}  // namespace

const char* const kServeEmptyDetails =
    R"({"controller_info": {}, "proxy_location": null, "http_options": null, "grpc_options": null, )"
    R"("proxies": {}, "applications": {}, "target_capacity": null})";

std::unique_ptr<ServeRuntime> MakeHeadServeRuntime(ActorDirectory& actors, JobManager& jobs,
                                                   const std::atomic<bool>& stopping) {
  return std::make_unique<HeadServeRuntime>(actors, jobs, stopping);
}

StatusOr<std::string> ValidateServeDeployConfig(std::string_view body) {
  auto parsed = ParseJson(body, "the request body");
  if (!parsed.ok()) return parsed.status();
  const Json& j = *parsed;
  if (!j.is_object()) return InvalidArgument("the request body must be a JSON object (Serve's config)");
  for (const auto& [k, v] : j.items()) {
    if (!k.empty() && k[0] == '_') return InvalidArgument("unknown field '" + k + "' in Serve's config");
  }
  if (auto apps = j.find("applications"); apps != j.end()) {
    if (!apps->is_array()) return InvalidArgument("applications must be a list of application objects");
    std::map<std::string, size_t> names, routes;
    for (size_t i = 0; i < apps->size(); ++i) {
      const Json& app = (*apps)[i];
      const std::string where = "applications[" + std::to_string(i) + "]";
      if (auto s = CheckApplication(app, where); !s.ok()) return s;
      std::string name = app.contains("name") ? app["name"].get<std::string>() : "default";
      if (auto [it, fresh] = names.emplace(name, i); !fresh) {
        return InvalidArgument(where + ".name \"" + name + "\" is also the name of applications[" +
                               std::to_string(it->second) + "]: application names must be unique");
      }
      // Ray's default route prefix is "/"; null means no HTTP route.
      if (app.contains("route_prefix") && app["route_prefix"].is_null()) continue;
      std::string route = app.contains("route_prefix") ? app["route_prefix"].get<std::string>() : "/";
      if (auto [it, fresh] = routes.emplace(route, i); !fresh) {
        return InvalidArgument(where + ".route_prefix \"" + route + "\" is also that of applications[" +
                               std::to_string(it->second) + "]: route prefixes must be unique");
      }
    }
  }
  return JsonText(j);
}

std::string ServeBootstrapCommand(std::string_view python) {
  std::string py = python.empty() ? "python3" : std::string(python);
  bool plain = py.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") ==
               std::string::npos;
  if (!plain) {
    std::string quoted = "'";
    for (char c : py) quoted += c == '\'' ? std::string("'\"'\"'") : std::string(1, c);
    py = quoted + "'";
  }
  return py + " -m torus.serve._private.rest_bootstrap";
}

ServeApi::ServeApi(KvStore& kv, std::unique_ptr<ServeRuntime> runtime, std::string bootstrap_command,
                   std::chrono::milliseconds shutdown_wait)
    : kv_(kv),
      runtime_(std::move(runtime)),
      bootstrap_command_(std::move(bootstrap_command)),
      shutdown_wait_(shutdown_wait) {}

Status ServeApi::StoreLocked(std::string config) {
  if (auto put = kv_.Put(kServeNamespace, kConfigKey, std::move(config), true); !put.ok()) return put.status();
  auto put = kv_.Put(kServeNamespace, kVersionKey, NextVersion(kv_.Get(kServeNamespace, kVersionKey)), true);
  return put.ok() ? Status::Ok() : put.status();
}

Status ServeApi::Deploy(std::string_view body) {
  auto config = ValidateServeDeployConfig(body);
  if (!config.ok()) return config.status();
  MutexLock lock(mu_);
  if (auto s = StoreLocked(std::move(*config)); !s.ok()) return s;
  if (runtime_->ControllerLive() || runtime_->BootstrapRunning()) return Status::Ok();
  return runtime_->StartBootstrap(bootstrap_command_);
}

Status ServeApi::Shutdown() {
  MutexLock lock(mu_);  // held while waiting: a PUT behind us finds Serve gone and starts it anew
  if (auto s = StoreLocked(kShutdownConfig); !s.ok()) return s;
  const auto deadline = std::chrono::steady_clock::now() + shutdown_wait_;
  while (runtime_->ControllerLive() && !runtime_->Stopping()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      TORUS_LOG(WARNING) << "serve: the controller is still alive " << shutdown_wait_.count()
                         << " ms after the shutdown was asked for; answering the DELETE";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::Ok();
}

StatusOr<std::string> ServeApi::Details(std::string_view api_type) {
  std::string source(api_type);
  for (char& c : source) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!source.empty() && source != "imperative" && source != "declarative") {
    return InvalidArgument("Invalid 'api_type' value: '" + std::string(api_type) +
                           "'. Must be one of: imperative, declarative");
  }
  // As Ray: without a controller, the empty details (a stale text from a controller gone is not
  // Serve's state any more).
  if (!runtime_->ControllerLive()) return std::string(kServeEmptyDetails);
  auto text = kv_.Get(kServeNamespace, kDetailsKey);
  if (!text) return std::string(kServeEmptyDetails);
  if (source.empty()) return std::move(*text);
  auto parsed = ParseJson(*text, "Serve's details");
  if (!parsed.ok() || !parsed->is_object() || !parsed->contains("applications") ||
      !(*parsed)["applications"].is_object()) {
    return std::move(*text);  // not ours to judge: the controller's text as it is
  }
  Json& apps = (*parsed)["applications"];
  for (auto it = apps.begin(); it != apps.end();) {
    bool keep = it->is_object() && it->value("source", Json()) == source;
    it = keep ? std::next(it) : apps.erase(it);
  }
  return JsonText(*parsed);
}

std::string ServeApi::Metrics() {
  if (!runtime_->ControllerLive()) return "";
  auto stored = kv_.Get(kServeNamespace, kServeMetricsKey);
  if (!stored) return "";
  ServeMetricsText kept = FilterServeMetrics(*stored);
  if (kept.refused.empty() && kept.dropped_lines == 0) {
    metrics_warned_ = false;
  } else if (!metrics_warned_.exchange(true)) {
    if (!kept.refused.empty()) {
      TORUS_LOG(WARNING) << "serve: not showing Serve's metrics (KV " << kServeNamespace << "/" << kServeMetricsKey
                         << "): " << kept.refused;
    } else {
      TORUS_LOG(WARNING) << "serve: " << kept.dropped_lines << " line(s) of Serve's metrics (KV " << kServeNamespace
                         << "/" << kServeMetricsKey << ") are not shown: only well-formed "
                         << kServeMetricPrefix << "* samples and their HELP/TYPE lines are";
    }
  }
  return std::move(kept.text);
}

void RegisterServeHttp(HttpServer& server, ServeApi& api) {
  using A = HttpServer::Access;
  // Routes match path segments, so this also serves the path without the trailing slash.
  const std::string path = "/api/serve/applications/";
  server.Handle("PUT", path, A::kToken, [&api](const HttpRequest& req) {
    if (auto s = api.Deploy(req.body); !s.ok()) return ErrorResponse(s);
    return HttpResponse::Text("");
  });
  server.Handle("GET", path, A::kToken, [&api](const HttpRequest& req) {
    auto details = api.Details(req.Query("api_type"));
    if (!details.ok()) return ErrorResponse(details.status());
    return HttpResponse::Json(std::move(*details));
  });
  server.Handle("DELETE", path, A::kToken, [&api](const HttpRequest&) {
    if (auto s = api.Shutdown(); !s.ok()) return ErrorResponse(s);
    return HttpResponse::Text("");
  });
}

}  // namespace torus
