#include "cli/ray_compat.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <set>

#include <nlohmann/json.hpp>

#include "common/json_limits.h"
#include "common/rpc.h"
#include "common/session.h"
#include "common/process.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

namespace {

// Ray's `ray start` flags that take no value.
const std::set<std::string> kRayBoolFlags = {"head", "block", "disable-usage-stats", "verbose",
                                             "no-monitor", "log-color", "force"};

// Ray start flags passed on under the same name (the value unchanged).
const std::set<std::string> kSameName = {"num-cpus", "num-gpus", "memory", "resources",
                                         "object-store-memory", "object-spilling-directory",
                                         "dashboard-agent-listen-port"};
// Head-only ones, with the same name.
const std::set<std::string> kHeadOnly = {"dashboard-host", "dashboard-port", "include-dashboard"};

// Why some common Ray flags mean nothing here (shown with the ignored list).
const std::map<std::string, std::string> kWhyIgnored = {
    {"disable-usage-stats", "Torus collects no usage statistics"},
    {"metrics-export-port", "metrics are served at /metrics of the dashboard and node agents"},
    {"dashboard-agent-grpc-port", "the node agent is HTTP only"},
    {"node-manager-port", "node ports are picked by the node"},
    {"object-manager-port", "objects move over the node's own port"},
    {"min-worker-port", "worker ports are picked by each worker"},
    {"max-worker-port", "worker ports are picked by each worker"},
    {"runtime-env-agent-port", "runtime environments are applied by the node itself"},
    {"ray-client-server-port", "Ray Client is not served"},
    {"temp-dir", "sessions live under TORUS_TMPDIR"},
    {"log-style", "Torus logs plain lines"},
    {"log-color", "Torus logs plain lines"},
    {"verbose", "Torus logs plain lines"},
};

struct RayArgs {
  std::string command;
  std::map<std::string, std::string> flags;
  std::vector<std::string> order;  // flag names as given (for the ignored list)
  std::vector<std::string> positional;
};

RayArgs Parse(const std::vector<std::string>& args) {
  RayArgs r;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& w = args[i];
    if (r.command.empty() && w.rfind("--", 0) != 0) {
      r.command = w;
      continue;
    }
    if (w.rfind("--", 0) != 0 || w.size() == 2) {
      r.positional.push_back(w);
      continue;
    }
    std::string name = w.substr(2), value = "1";
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (!kRayBoolFlags.count(name) && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      value = args[++i];
    }
    std::replace(name.begin(), name.end(), '_', '-');
    if (!r.flags.count(name)) r.order.push_back(name);
    r.flags[name] = value;
  }
  return r;
}

// Ray's --labels: "k1=v1,k2=v2" (Ray 2.4x and later) or a JSON object (earlier), as k=v,...
std::string LabelsArg(const std::string& v, std::string* error) {
  if (v.empty() || v.front() != '{') return v;
  auto parsed = ParseJson(v, "ray start --labels");
  if (!parsed.ok() || !parsed->is_object()) {
    auto depth = CheckJsonDepth(v, "ray start --labels");
    *error = depth.ok() ? "ray start --labels: not a JSON object or k=v list: " + v : depth.message();
    return "";
  }
  const nlohmann::json& j = *parsed;
  std::string out;
  for (const auto& [k, val] : j.items()) {
    if (!val.is_string()) {
      *error = "ray start --labels: the value of '" + k + "' is not a string";
      return "";
    }
    out += (out.empty() ? "" : ",") + k + "=" + val.get<std::string>();
  }
  return out;
}

bool Truthy(const std::string& v) { return v == "1" || v == "true" || v == "True" || v == "yes"; }

RayTranslation TranslateStart(const RayArgs& r, const std::string& default_ip) {
  RayTranslation t;
  const bool head = r.flags.count("head") && Truthy(r.flags.at("head"));
  if (!head && !r.flags.count("address")) {
    t.error = "ray start needs --head (start the head) or --address HEAD_HOST:PORT (join a cluster)";
    return t;
  }
  auto& a = t.torus_args;
  a = {"start"};
  if (head) {
    a.insert(a.end(), {"--head", "--port", r.flags.count("port") ? r.flags.at("port") : "6379"});
    // Ray's GCS port listens on every interface: KubeRay's head container has
    // RAY_ADDRESS=127.0.0.1:6379, and other pods dial the pod's address.
    a.insert(a.end(), {"--listen-host", "0.0.0.0"});
  } else {
    a.insert(a.end(), {"--address", r.flags.at("address")});
  }
  a.insert(a.end(), {"--bind", r.flags.count("node-ip-address") ? r.flags.at("node-ip-address")
                                                                 : default_ip});
  // KubeRay probes the node agent at http://localhost:<agent port>: it listens everywhere.
  a.insert(a.end(), {"--dashboard-agent-host", "0.0.0.0"});
  for (const auto& name : r.order) {
    const std::string& v = r.flags.at(name);
    if (name == "head" || name == "address" || name == "port" || name == "node-ip-address") {
      if (name == "port" && !head) t.ignored.push_back("--port (only a head listens on it)");
      continue;
    }
    if (name == "block") {
      if (Truthy(v)) a.push_back("--block");
    } else if (kSameName.count(name) || (head && kHeadOnly.count(name))) {
      a.insert(a.end(), {"--" + name, v});
    } else if (name == "labels") {
      std::string labels = LabelsArg(v, &t.error);
      if (!t.error.empty()) return t;
      a.insert(a.end(), {"--labels", labels});
    } else {
      auto why = kWhyIgnored.find(name);
      t.ignored.push_back("--" + name +
                          (why != kWhyIgnored.end() ? " (" + why->second + ")"
                           : kHeadOnly.count(name)  ? " (only a head serves the dashboard)"
                                                    : ""));
    }
  }
  return t;
}

}  // namespace

RayTranslation TranslateRay(const std::vector<std::string>& args,
                            const std::map<std::string, std::string>& env,
                            const std::string& default_ip) {
  RayArgs r = Parse(args);
  RayTranslation t;
  if (r.command == "start") {
    t = TranslateStart(r, default_ip);
  } else if (r.command == "stop") {
    t.torus_args = {"stop"};
    if (r.flags.count("force")) t.torus_args.push_back("--force");
  } else if (r.command == "status") {
    t.torus_args = {"status"};
    if (r.flags.count("address")) t.torus_args.insert(t.torus_args.end(), {"--address", r.flags.at("address")});
  } else if (r.command == "health-check") {
    if (!r.flags.count("address")) {
      t.error = "ray health-check needs --address HEAD_HOST:PORT";
      return t;
    }
    t.health_check = true;
    t.torus_args = {r.flags.at("address")};
    for (const auto& name : r.order) {
      if (name != "address") t.ignored.push_back("--" + name);
    }
  } else {
    t.error = r.command.empty() ? "usage: ray start|stop|status|health-check ... (Torus's ray entry point)"
                                : "ray " + r.command + " is not provided by Torus's ray entry point "
                                  "(start, stop, status, health-check are; see `torus --help`)";
    return t;
  }
  auto tok = env.find("TORUS_TOKEN");
  auto ray_tok = env.find("RAY_AUTH_TOKEN");
  if ((tok == env.end() || tok->second.empty()) && ray_tok != env.end() && !ray_tok->second.empty()) {
    t.env["TORUS_TOKEN"] = ray_tok->second;
  }
  return t;
}

std::string OutwardAddress() {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return "127.0.0.1";
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(53);
  inet_pton(AF_INET, "8.8.8.8", &dst.sin_addr);  // a connected UDP socket sends nothing
  std::string ip = "127.0.0.1";
  sockaddr_in local{};
  socklen_t len = sizeof local;
  if (connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    char buf[INET_ADDRSTRLEN] = {0};
    if (inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf)) ip = buf;
  }
  close(fd);
  return ip;
}

namespace {

// A Torus head answers at `address` (any answer, even one refusing a missing token).
bool HeadAnswers(const std::string& address, const std::string& token) {
  auto stub = rpc::Head::NewStub(GetChannel(address));
  rpc::ListReply reply;
  auto ctx = NewContext(token, 2000);
  auto st = stub->List(ctx.get(), rpc::Empty(), &reply);
  return st.ok() || st.error_code() == grpc::StatusCode::UNAUTHENTICATED;
}

}  // namespace

int RayCompatMain(const std::vector<std::string>& args) {
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << "usage: ray start|stop|status|health-check [options]\n"
                 "Torus's ray entry point: Ray's CLI as KubeRay runs it in its pods, served by\n"
                 "`torus ray ...` (ray start runs the Torus head or node in the foreground).\n";
    return 0;
  }
  // The token the command uses (TORUS_TOKEN, else RAY_AUTH_TOKEN) through the one token rule,
  // and passed on cleaned: a Kubernetes secret often ends in a newline.
  std::map<std::string, std::string> env;
  for (const char* k : {"TORUS_TOKEN", "RAY_AUTH_TOKEN"}) {
    const char* v = std::getenv(k);
    if (!v || !*v) continue;
    auto tok = CleanToken(v, k);
    if (!tok.ok()) {
      std::cerr << "ray (Torus): " << tok.status().message() << "\n";
      return 2;
    }
    env[k] = *tok;
    if (std::string(k) == "TORUS_TOKEN") setenv(k, tok->c_str(), 1);
    break;
  }
  RayTranslation t = TranslateRay(args, env, OutwardAddress());
  if (!t.error.empty()) {
    std::cerr << "ray (Torus): " << t.error << "\n";
    return 2;
  }
  if (!t.ignored.empty()) {
    std::string list;
    for (const auto& f : t.ignored) list += (list.empty() ? "" : ", ") + f;
    std::cerr << "ray (Torus): ignoring " << list << "\n";
  }
  for (const auto& [k, v] : t.env) setenv(k.c_str(), v.c_str(), 1);
  if (t.health_check) {
    const char* tok = std::getenv("TORUS_TOKEN");
    if (HeadAnswers(t.torus_args[0], tok ? tok : "")) return 0;
    std::cerr << "ray (Torus): no Torus head answers at " << t.torus_args[0] << "\n";
    return 1;
  }
  std::string self = SelfExecutable();
  std::vector<char*> argv;
  std::string prog = "torus";
  argv.push_back(prog.data());
  for (auto& a : t.torus_args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(self.c_str(), argv.data());
  std::cerr << "ray (Torus): cannot run " << self << "\n";
  return 1;
}

}  // namespace torus
