#include "launcher/manifest.h"

#include "common/json_limits.h"
#include "common/labels.h"
#include "common/resources.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tpu/node_identity.h"

namespace torus::launcher {
namespace {

// Collects problems and ignored fields while walking the document.
struct Walk {
  std::vector<std::string> problems;
  std::set<std::string> ignored;

  void Problem(const std::string& where, const std::string& what) {
    problems.push_back(where + ": " + what);
  }
  // Records `path` (list indices collapsed to []) as present but unused.
  void Ignore(const std::string& path) {
    std::string p;
    for (size_t i = 0; i < path.size(); ++i) {
      if (path[i] == '[') {
        size_t close = path.find(']', i);
        if (close != std::string::npos) {
          p += "[]";
          i = close;
          continue;
        }
      }
      p += path[i];
    }
    ignored.insert(p);
  }
};

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// 4 -> "4", 0.5 -> "0.5".
std::string Num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

std::string At(const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  if (m.is_null()) return "";
  return " (line " + std::to_string(m.line + 1) + ")";
}

std::string ScalarText(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  if (n.IsMap()) return "a map";
  if (n.IsSequence()) return "a list";
  return "null";
}

std::optional<std::string> GetString(Walk& w, const YAML::Node& n, const std::string& path) {
  if (!n.IsScalar()) {
    w.Problem(path, "is " + ScalarText(n) + At(n) + "; expected a string");
    return std::nullopt;
  }
  return n.Scalar();
}

std::optional<int> GetInt(Walk& w, const YAML::Node& n, const std::string& path) {
  if (n.IsScalar()) {
    const std::string& s = n.Scalar();
    int v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && p == s.data() + s.size()) return v;
  }
  w.Problem(path, Quote(ScalarText(n)) + At(n) + " is not an integer");
  return std::nullopt;
}

// A map of scalar -> scalar (labels, nodeSelector, annotations).
std::map<std::string, std::string> GetStringMap(Walk& w, const YAML::Node& n,
                                                const std::string& path) {
  std::map<std::string, std::string> out;
  if (n.IsNull()) return out;
  if (!n.IsMap()) {
    w.Problem(path, "is " + ScalarText(n) + At(n) + "; expected a map of strings");
    return out;
  }
  for (auto it = n.begin(); it != n.end(); ++it) {
    std::string k = it->first.Scalar();
    if (!it->second.IsScalar()) {
      w.Problem(path + "." + k, "is " + ScalarText(it->second) + At(it->second) + "; expected a string");
      continue;
    }
    out[k] = it->second.Scalar();
  }
  return out;
}

bool IsDnsLabel(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return s.front() != '-' && s.back() != '-';
}

// Resource amounts of a container's limits or requests that Torus reads.
struct PodResources {
  std::optional<double> cpu, memory, tpu;
  int tpu_containers = 0;
  std::vector<std::pair<std::string, std::string>> env;  // of the TPU container, else the first
};

// A container's `resources`: per resource, limits else requests, added to the pod's cpu and
// memory; returns the container's google.com/tpu, if it asks for any.
std::optional<double> ReadContainerResources(Walk& w, const YAML::Node& v, const std::string& cp, PodResources* pod) {
  if (!v.IsMap()) {
    if (!v.IsNull()) w.Problem(cp + ".resources", "is " + ScalarText(v) + At(v) + "; expected a map");
    return std::nullopt;
  }
  std::map<std::string, double> amounts;
  for (const char* part : {"requests", "limits"}) {
    for (auto rit = v.begin(); rit != v.end(); ++rit) {
      if (rit->first.Scalar() != part) continue;
      std::string rp = cp + ".resources." + part;
      auto m = GetStringMap(w, rit->second, rp);
      for (const auto& [name, q] : m) {
        if (name != "cpu" && name != "memory" && name != kTpuResourceName) {
          w.Ignore(rp + "." + name);
          continue;
        }
        auto amount = ParseQuantity(q);
        if (!amount || *amount < 0) {
          w.Problem(rp + "." + name, Quote(q) + " is not a valid quantity; expected e.g. 4, 500m or 16Gi");
          continue;
        }
        amounts[name] = *amount;  // limits are read second and win
      }
    }
  }
  for (auto rit = v.begin(); rit != v.end(); ++rit) {
    std::string part = rit->first.Scalar();
    if (part != "requests" && part != "limits") w.Ignore(cp + ".resources." + part);
  }
  auto add = [&](std::optional<double>& total, const std::string& name) {
    if (amounts.count(name)) total = total.value_or(0) + amounts[name];
  };
  add(pod->cpu, "cpu");
  add(pod->memory, "memory");
  if (amounts.count(std::string(kTpuResourceName))) return amounts[std::string(kTpuResourceName)];
  return std::nullopt;
}

// A container's `env`: its name/value entries in order (valueFrom is ignored).
std::vector<std::pair<std::string, std::string>> ReadContainerEnv(Walk& w, const YAML::Node& v,
                                                                  const std::string& cp) {
  std::vector<std::pair<std::string, std::string>> env;
  if (v.IsNull()) return env;
  if (!v.IsSequence()) {
    w.Problem(cp + ".env", "is " + ScalarText(v) + At(v) + "; expected a list of name/value");
    return env;
  }
  for (size_t e = 0; e < v.size(); ++e) {
    std::string ep = cp + ".env[" + std::to_string(e) + "]";
    const YAML::Node ev = v[e];
    if (!ev.IsMap() || !ev["name"] || !ev["name"].IsScalar() || ev["name"].Scalar().empty()) {
      w.Problem(ep, "has no name" + At(ev) + "; expected {name: ..., value: ...}");
      continue;
    }
    std::string value;
    for (auto eit = ev.begin(); eit != ev.end(); ++eit) {
      std::string ek = eit->first.Scalar();
      if (ek == "name") continue;
      if (ek == "value") {
        if (auto s = GetString(w, eit->second, ep + ".value")) value = *s;
      } else {
        w.Ignore(ep + "." + ek);  // valueFrom: there is no Kubernetes API to resolve it
      }
    }
    env.emplace_back(ev["name"].Scalar(), value);
  }
  return env;
}

PodResources ReadContainers(Walk& w, const YAML::Node& containers, const std::string& path) {
  PodResources pod;
  if (containers.IsNull()) return pod;
  if (!containers.IsSequence()) {
    w.Problem(path, "is " + ScalarText(containers) + At(containers) + "; expected a list of containers");
    return pod;
  }
  bool env_from_tpu = false;
  for (size_t i = 0; i < containers.size(); ++i) {
    const YAML::Node c = containers[i];
    std::string cp = path + "[" + std::to_string(i) + "]";
    if (!c.IsMap()) {
      w.Problem(cp, "is " + ScalarText(c) + At(c) + "; expected a container");
      continue;
    }
    std::optional<double> tpu;
    std::vector<std::pair<std::string, std::string>> env;
    for (auto it = c.begin(); it != c.end(); ++it) {
      std::string key = it->first.Scalar();
      if (key == "resources") {
        if (auto t = ReadContainerResources(w, it->second, cp, &pod)) tpu = t;
      } else if (key == "env") {
        auto more = ReadContainerEnv(w, it->second, cp);
        env.insert(env.end(), more.begin(), more.end());
      } else {
        w.Ignore(cp + "." + key);
      }
    }
    if (tpu) {
      ++pod.tpu_containers;
      pod.tpu = pod.tpu.value_or(0) + *tpu;
      if (!env_from_tpu) pod.env = env;
      env_from_tpu = true;
    } else if (i == 0) {
      pod.env = env;
    }
  }
  return pod;
}

// rayStartParams.resources: a JSON object, often written as a quoted string ('"{\"TPU\": 4}"').
void ReadResourcesJson(Walk& w, std::string text, const std::string& path,
                       std::map<std::string, double>& out) {
  if (text.size() >= 2 && text.front() == '"' && text.back() == '"') {
    text = text.substr(1, text.size() - 2);
    std::string unescaped;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\\' && i + 1 < text.size()) ++i;
      unescaped += text[i];
    }
    text = unescaped;
  }
  const bool deep = !CheckJsonDepth(text, path).ok();  // nothing below may recurse on it
  nlohmann::json j = deep ? nlohmann::json() : nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    w.Problem(path, deep ? "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels"
                         : Quote(text) + " is not a JSON object; expected e.g. '{\"custom\": 2}'");
    return;
  }
  for (auto& [k, v] : j.items()) {
    if (!v.is_number() || v.get<double>() < 0) {
      w.Problem(path, "amount of " + Quote(k) + " is " + v.dump() + "; expected a non-negative number");
      continue;
    }
    out[k] = v.get<double>();
  }
}

std::string KnownAccelerators() {
  std::string s;
  for (auto g : tpu::AllGenerations()) {
    for (const auto& v : tpu::GkeAcceleratorValues(g)) s += (s.empty() ? "" : ", ") + v;
  }
  return s;
}

// What a group's keys say beyond the GroupSpec fields they fill directly.
struct GroupFields {
  std::string where;  // the group in messages: its path, with its name when it has one
  std::optional<double> num_cpus;
  std::map<std::string, double> start_resources, group_resources;
  PodResources pod;
  bool has_num_of_hosts = false;
  int raw_num_of_hosts = 1;
};

// A worker group's groupName, checked; returns where the group is, for messages.
std::string ReadGroupName(Walk& w, const YAML::Node& g, const std::string& path, GroupSpec* spec) {
  const YAML::Node n = g["groupName"];
  if (!n) {
    w.Problem(path + ".groupName", "missing" + At(g) + "; expected a name");
    return path;
  }
  auto s = GetString(w, n, path + ".groupName");
  if (!s) return path;
  spec->name = *s;
  if (!IsDnsLabel(spec->name)) {
    w.Problem(path + ".groupName", Quote(spec->name) + At(n) +
                                       " is not a valid name; expected lowercase letters, digits and '-' (at most 63)");
  }
  return path + " (group " + Quote(spec->name) + ")";
}

void ReadRayStartParams(Walk& w, const YAML::Node& v, const std::string& kp, GroupSpec* spec, GroupFields* f) {
  if (v.IsNull()) return;
  if (!v.IsMap()) {
    w.Problem(kp, "is " + ScalarText(v) + At(v) + "; expected a map of strings");
    return;
  }
  for (auto pit = v.begin(); pit != v.end(); ++pit) {
    std::string pk = pit->first.Scalar();
    std::string pp = kp + "." + pk;
    if (pk == "num-cpus") {
      auto s = GetString(w, pit->second, pp);
      auto q = s ? ParseQuantity(*s) : std::nullopt;
      if (s && (!q || *q < 0)) w.Problem(pp, Quote(*s) + " is not a non-negative number");
      if (q && *q >= 0) f->num_cpus = *q;
    } else if (pk == "resources") {
      if (auto s = GetString(w, pit->second, pp)) ReadResourcesJson(w, *s, pp, f->start_resources);
    } else if (pk == "object-store-memory") {
      auto s = GetString(w, pit->second, pp);
      auto q = s ? ParseQuantity(*s) : std::nullopt;
      if (s && (!q || *q < (1 << 20) || *q > 1e18)) {
        w.Problem(pp, Quote(*s) + " is not a byte count of at least 1 MiB");
      } else if (q) {
        spec->object_store_bytes = static_cast<uint64_t>(*q);
      }
    } else {
      w.Ignore(pp);
    }
  }
}

// template: metadata.annotations, spec.nodeSelector and spec.containers.
void ReadPodTemplate(Walk& w, const YAML::Node& v, const std::string& kp, GroupSpec* spec, GroupFields* f) {
  if (!v.IsMap()) {
    w.Problem(kp, "is " + ScalarText(v) + At(v) + "; expected a pod template");
    return;
  }
  for (auto tit = v.begin(); tit != v.end(); ++tit) {
    std::string tk = tit->first.Scalar();
    const YAML::Node tv = tit->second;
    std::string tp = kp + "." + tk;
    if (tk == "metadata" && tv.IsMap()) {
      for (auto mit = tv.begin(); mit != tv.end(); ++mit) {
        if (mit->first.Scalar() == "annotations") {
          spec->annotations = GetStringMap(w, mit->second, tp + ".annotations");
        } else {
          w.Ignore(tp + "." + mit->first.Scalar());
        }
      }
    } else if (tk == "spec" && tv.IsMap()) {
      for (auto sit = tv.begin(); sit != tv.end(); ++sit) {
        std::string sk = sit->first.Scalar();
        if (sk == "nodeSelector") {
          spec->node_selector = GetStringMap(w, sit->second, tp + ".nodeSelector");
        } else if (sk == "containers") {
          f->pod = ReadContainers(w, sit->second, tp + ".containers");
        } else {
          w.Ignore(tp + "." + sk);
        }
      }
    } else {
      w.Ignore(tp);
    }
  }
}

// One key of a group spec (groupName already read).
void ReadGroupKey(Walk& w, const std::string& key, const YAML::Node& v, const std::string& kp, bool is_head,
                  GroupSpec* spec, GroupFields* f) {
  if (!is_head && (key == "replicas" || key == "minReplicas" || key == "maxReplicas")) {
    auto n = GetInt(w, v, kp);
    if (!n) return;
    if (*n < 0) w.Problem(kp, std::to_string(*n) + At(v) + "; expected >= 0");
    if (key == "replicas") spec->replicas = std::max(0, *n);
    if (key == "minReplicas") spec->min_replicas = *n;
    if (key == "maxReplicas") spec->max_replicas = *n;
  } else if (!is_head && key == "numOfHosts") {
    if (auto n = GetInt(w, v, kp)) {
      f->has_num_of_hosts = true;
      f->raw_num_of_hosts = *n;
    }
  } else if (key == "rayStartParams") {
    ReadRayStartParams(w, v, kp, spec, f);
  } else if (key == "resources") {
    for (const auto& [name, q] : GetStringMap(w, v, kp)) {
      auto amount = ParseQuantity(q);
      if (!amount || *amount < 0) {
        w.Problem(kp + "." + name, Quote(q) + " is not a non-negative number");
      } else {
        f->group_resources[name] = *amount;
      }
    }
  } else if (key == "labels") {
    spec->labels = GetStringMap(w, v, kp);
  } else if (key == "template") {
    ReadPodTemplate(w, v, kp, spec, f);
  } else {
    w.Ignore(kp);
  }
}

// Resources, weakest first: container cpu/memory, rayStartParams.resources, group resources,
// num-cpus. CPU from a container is rounded up, as `ray start` is given whole CPUs.
void SetGroupResources(Walk& w, const GroupFields& f, GroupSpec* spec) {
  if (f.pod.cpu) spec->resources["CPU"] = std::ceil(*f.pod.cpu);
  if (f.pod.memory) spec->resources["memory"] = std::floor(*f.pod.memory);
  for (const auto& [k, v] : f.start_resources) spec->resources[k] = v;
  for (const auto& [k, v] : f.group_resources) spec->resources[k] = v;
  if (f.num_cpus) spec->resources["CPU"] = *f.num_cpus;
  if (auto s = ValidateResources(spec->resources, "resources"); !s.ok()) {
    w.Problem(f.where, s.message());
  }
}

// Labels: no reserved TPU key, nothing the --labels transport cannot carry.
void CheckGroupLabels(Walk& w, const std::string& where, const GroupSpec& spec) {
  if (auto s = ValidateUserLabels(spec.labels, "labels"); !s.ok()) w.Problem(where, s.message());
  for (const auto& [k, v] : spec.labels) {
    if (k.empty() || k.find_first_of(",=") != std::string::npos || v.find(',') != std::string::npos) {
      w.Problem(where + " labels", "label " + Quote(k + "=" + v) + " may not contain ',' (nor '=' in the key)");
    }
    if (k == kNodeGroupLabel) {
      w.Problem(where + " labels", "key " + Quote(k) + " is set by the launcher to the group name");
    }
  }
}

// P, the chips per pod: one TPU container asking for a positive whole number. False if not.
bool ReadTpuChips(Walk& w, const GroupFields& f, GroupSpec* spec) {
  bool p_ok = true;
  if (f.pod.tpu_containers > 1) {
    w.Problem(f.where + " template.spec.containers",
              std::to_string(f.pod.tpu_containers) +
                  " containers ask for google.com/tpu; expected exactly one TPU container per pod");
    p_ok = false;
  }
  double p = f.pod.tpu.value_or(0);
  if (p <= 0 || p != std::floor(p) || p > 1e6) {
    w.Problem(f.where + " google.com/tpu", "is " + Num(p) +
                                               "; expected a positive integer number of chips per pod");
    p_ok = false;
  } else {
    spec->tpu_chips = static_cast<int>(p);
  }
  return p_ok;
}

// The generation (accelerator selector) and the slice topology (topology selector; no
// subslice annotation). True when the topology is valid: spec's generation, topology,
// slice_chips and pod_type are then set.
bool ReadTpuSlice(Walk& w, const std::string& where, GroupSpec* spec) {
  std::optional<tpu::Generation> gen;
  auto acc = spec->node_selector.find(std::string(kGkeAcceleratorSelector));
  if (acc == spec->node_selector.end()) {
    w.Problem(where + " nodeSelector",
              "missing " + std::string(kGkeAcceleratorSelector) + "; expected one of " + KnownAccelerators());
  } else {
    gen = tpu::GenerationFromGkeAccelerator(acc->second);
    if (!gen) {
      w.Problem(where + " nodeSelector " + std::string(kGkeAcceleratorSelector),
                Quote(acc->second) + " is not a known TPU accelerator; expected one of " + KnownAccelerators());
    }
  }
  if (spec->annotations.count(std::string(kGkeSubsliceAnnotation))) {
    w.Problem(where + " annotation " + std::string(kGkeSubsliceAnnotation),
              Quote(spec->annotations[std::string(kGkeSubsliceAnnotation)]) +
                  ": subslices are not supported in v1; expected a whole slice chosen by " +
                  std::string(kGkeTopologySelector));
  }
  auto topo = spec->node_selector.find(std::string(kGkeTopologySelector));
  if (topo == spec->node_selector.end()) {
    w.Problem(where + " nodeSelector",
              "missing " + std::string(kGkeTopologySelector) + "; expected the slice topology, e.g. 4x4 or 2x2x2");
    return false;
  }
  if (!gen) return false;
  if (auto s = tpu::ValidateTopology(*gen, topo->second); !s.ok()) {
    w.Problem(where + " nodeSelector " + std::string(kGkeTopologySelector), s.message());
    return false;
  }
  spec->generation = *gen;
  spec->topology = tpu::NormalizeTopology(topo->second);
  spec->slice_chips = *tpu::TopologyChips(spec->topology);
  spec->pod_type = tpu::PodTypeName(*gen, spec->slice_chips);
  return true;
}

// P divides the slice's C chips, and numOfHosts is C / P.
void CheckHostsMatchTopology(Walk& w, const GroupFields& f, const GroupSpec& spec) {
  int c = spec.slice_chips, pp = spec.tpu_chips;
  if (c % pp != 0) {
    w.Problem(f.where + " google.com/tpu",
              std::to_string(pp) + " does not divide the " + std::to_string(c) + " chips of topology " +
                  spec.topology + "; expected a divisor of " + std::to_string(c));
  } else if (!(f.has_num_of_hosts && f.raw_num_of_hosts < 1)) {
    int want = std::max(c / pp, 1);
    if (spec.num_of_hosts != want) {
      w.Problem(f.where + " numOfHosts",
                "Number of workers in worker group not equal to specified topology: numOfHosts is " +
                    std::to_string(spec.num_of_hosts) + ", expected " + std::to_string(want) + " (" +
                    std::to_string(c) + " chips of " + spec.topology + " / " + std::to_string(pp) +
                    " per host)");
    }
  }
}

// The TPU group rules (§5 "Validation").
void ApplyTpuRules(Walk& w, const GroupFields& f, GroupSpec* spec) {
  spec->num_of_hosts = f.raw_num_of_hosts;
  bool p_ok = ReadTpuChips(w, f, spec);
  if (f.has_num_of_hosts && f.raw_num_of_hosts < 1) {
    w.Problem(f.where + " numOfHosts", std::to_string(f.raw_num_of_hosts) + "; expected >= 1 for a TPU group");
  } else if (!f.has_num_of_hosts) {
    spec->num_of_hosts = 1;
  }
  bool topo_ok = ReadTpuSlice(w, f.where, spec);
  if (topo_ok && p_ok && spec->tpu_chips > 0) CheckHostsMatchTopology(w, f, *spec);
}

GroupSpec ReadGroup(Walk& w, const YAML::Node& g, const std::string& path, bool is_head) {
  GroupSpec spec;
  spec.is_head = is_head;
  spec.name = is_head ? "headgroup" : "";
  if (is_head) spec.replicas = 1;
  if (!g.IsMap()) {
    w.Problem(path, "is " + ScalarText(g) + At(g) + "; expected a group spec");
    return spec;
  }
  GroupFields f;
  f.where = is_head ? path : ReadGroupName(w, g, path, &spec);
  for (auto it = g.begin(); it != g.end(); ++it) {
    const std::string key = it->first.Scalar();
    if (key == "groupName" && !is_head) continue;
    ReadGroupKey(w, key, it->second, path + "." + key, is_head, &spec, &f);
  }
  spec.env = f.pod.env;
  SetGroupResources(w, f, &spec);
  CheckGroupLabels(w, f.where, spec);
  if (is_head) {
    if (f.pod.tpu_containers > 0) {
      w.Problem(path + ".template.spec.containers",
                "the head group asks for google.com/tpu (" + Num(f.pod.tpu.value_or(0)) +
                    "); expected no TPU on the head (TPU hosts belong in workerGroupSpecs)");
    }
    return spec;
  }
  if (f.pod.tpu_containers == 0) {
    // Not a TPU group: KubeRay reads numOfHosts <= 0 as 1.
    spec.num_of_hosts = std::max(1, f.raw_num_of_hosts);
    return spec;
  }
  ApplyTpuRules(w, f, &spec);
  return spec;
}

}  // namespace

std::optional<double> ParseQuantity(std::string_view q) {
  size_t i = 0;
  while (i < q.size() && (std::isdigit(static_cast<unsigned char>(q[i])) || q[i] == '.' || q[i] == '+' ||
                          q[i] == '-')) {
    ++i;
  }
  // A decimal exponent: 'e' followed by a digit or sign.
  if (i < q.size() && q[i] == 'e' && i + 1 < q.size() &&
      (std::isdigit(static_cast<unsigned char>(q[i + 1])) || q[i + 1] == '+' || q[i + 1] == '-')) {
    ++i;
    if (q[i] == '+' || q[i] == '-') ++i;
    while (i < q.size() && std::isdigit(static_cast<unsigned char>(q[i]))) ++i;
  }
  std::string num(q.substr(0, i));
  std::string_view suffix = q.substr(i);
  if (num.empty()) return std::nullopt;
  double v = 0;
  try {
    size_t used = 0;
    v = std::stod(num, &used);
    if (used != num.size()) return std::nullopt;
  } catch (...) {
    return std::nullopt;
  }
  static const std::map<std::string_view, double> kSuffix = {
      {"", 1},       {"m", 1e-3},          {"k", 1e3},           {"M", 1e6},
      {"G", 1e9},    {"T", 1e12},          {"P", 1e15},          {"E", 1e18},
      {"Ki", 1024.0}, {"Mi", 1048576.0},   {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
      {"Pi", 1125899906842624.0}, {"Ei", 1152921504606846976.0}};
  auto it = kSuffix.find(suffix);
  if (it == kSuffix.end()) return std::nullopt;
  return v * it->second;
}

namespace {

const char kValidatePrefix[] = "Failed to validate RayCluster: ";

// The problems found so far as one InvalidArgument.
Status Problems(const Walk& w) {
  std::string msg;
  for (const auto& p : w.problems) msg += (msg.empty() ? "" : "; ") + p;
  return InvalidArgument(kValidatePrefix + msg);
}

// The one YAML document of `yaml_text`, a map.
StatusOr<YAML::Node> LoadDocument(std::string_view yaml_text) {
  const std::string prefix = kValidatePrefix;
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return InvalidArgument(prefix + "malformed YAML at line " + std::to_string(e.mark.line + 1) +
                           ", column " + std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  if (docs.size() != 1) {
    return InvalidArgument(prefix + "expected exactly one YAML document, found " + std::to_string(docs.size()));
  }
  if (!docs[0].IsMap()) {
    return InvalidArgument(prefix + "the document is " + ScalarText(docs[0]) + "; expected a RayCluster object");
  }
  return docs[0];
}

// kind RayCluster, apiVersion ray.io/v1.
void CheckKind(Walk& w, const YAML::Node& root) {
  const YAML::Node api = root["apiVersion"], kind = root["kind"];
  std::string api_s = api && api.IsScalar() ? api.Scalar() : "";
  std::string kind_s = kind && kind.IsScalar() ? kind.Scalar() : "";
  if (kind_s != "RayCluster") {
    w.Problem("kind", (kind ? Quote(ScalarText(kind)) : std::string("missing")) +
                          "; expected RayCluster (the only kind torus up launches)");
  }
  if (api_s != "ray.io/v1") {
    w.Problem("apiVersion", (api ? Quote(ScalarText(api)) : std::string("missing")) + "; expected ray.io/v1");
  }
}

// `spec`: the head group and the worker groups. Returns whether there was a head group.
bool ReadClusterSpec(Walk& w, const YAML::Node& v, ClusterSpec* spec) {
  if (!v.IsMap()) {
    w.Problem("spec", "is " + ScalarText(v) + At(v) + "; expected a RayCluster spec");
    return false;
  }
  bool have_head = false;
  for (auto sit = v.begin(); sit != v.end(); ++sit) {
    const std::string sk = sit->first.Scalar();
    const YAML::Node sv = sit->second;
    if (sk == "headGroupSpec") {
      have_head = true;
      spec->head = ReadGroup(w, sv, "spec.headGroupSpec", /*is_head=*/true);
    } else if (sk == "workerGroupSpecs") {
      if (sv.IsNull()) continue;
      if (!sv.IsSequence()) {
        w.Problem("spec.workerGroupSpecs", "is " + ScalarText(sv) + At(sv) + "; expected a list");
        continue;
      }
      for (size_t i = 0; i < sv.size(); ++i) {
        spec->workers.push_back(ReadGroup(w, sv[i], "spec.workerGroupSpecs[" + std::to_string(i) + "]", false));
      }
    } else {
      w.Ignore("spec." + sk);
    }
  }
  return have_head;
}

// metadata.name, a DNS label.
void ReadClusterName(Walk& w, const YAML::Node& root, ClusterSpec* spec) {
  const YAML::Node name = root["metadata"] && root["metadata"].IsMap() ? root["metadata"]["name"] : YAML::Node();
  if (!name || !name.IsScalar() || name.Scalar().empty()) {
    w.Problem("metadata.name", "missing; expected the cluster name");
    return;
  }
  spec->name = name.Scalar();
  if (!IsDnsLabel(spec->name)) {
    w.Problem("metadata.name", Quote(spec->name) + At(name) +
                                   " is not a valid name; expected lowercase letters, digits and '-' (at most 63)");
  }
}

void CheckUniqueGroupNames(Walk& w, const ClusterSpec& spec) {
  std::set<std::string> names;
  for (size_t i = 0; i < spec.workers.size(); ++i) {
    const auto& g = spec.workers[i];
    if (!g.name.empty() && !names.insert(g.name).second) {
      w.Problem("spec.workerGroupSpecs[" + std::to_string(i) + "].groupName",
                Quote(g.name) + " is used by an earlier group; expected unique group names");
    }
  }
}

}  // namespace

StatusOr<ClusterSpec> ParseRayCluster(std::string_view yaml_text) {
  auto root = LoadDocument(yaml_text);
  if (!root.ok()) return root.status();
  Walk w;
  ClusterSpec spec;
  CheckKind(w, *root);
  if (!w.problems.empty()) return Problems(w);
  bool have_head = false;
  for (auto it = root->begin(); it != root->end(); ++it) {
    const std::string key = it->first.Scalar();
    const YAML::Node v = it->second;
    if (key == "apiVersion" || key == "kind") continue;
    if (key == "metadata") {
      if (!v.IsMap()) {
        w.Problem("metadata", "is " + ScalarText(v) + At(v) + "; expected a map with a name");
        continue;
      }
      for (auto mit = v.begin(); mit != v.end(); ++mit) {
        if (mit->first.Scalar() != "name") w.Ignore("metadata." + mit->first.Scalar());
      }
    } else if (key == "spec") {
      if (ReadClusterSpec(w, v, &spec)) have_head = true;
    } else {
      w.Ignore(key);
    }
  }
  ReadClusterName(w, *root, &spec);
  if (!have_head) w.Problem("spec.headGroupSpec", "missing; expected the head group");
  CheckUniqueGroupNames(w, spec);
  if (!w.problems.empty()) return Problems(w);
  spec.ignored_fields.assign(w.ignored.begin(), w.ignored.end());
  return spec;
}

std::string HeadlessSubdomain(std::string_view cluster_name) {
  std::string s = std::string(cluster_name) + "-headless";
  if (s.size() > 63) s = s.substr(s.size() - 63);
  if (!s.empty() && !std::isalpha(static_cast<unsigned char>(s[0]))) s[0] = 'r';
  return s;
}

std::vector<HostPlan> PlanHosts(const ClusterSpec& spec) {
  std::vector<HostPlan> out;
  const std::string sub = HeadlessSubdomain(spec.name);
  auto base = [&](const GroupSpec& g) {
    HostPlan h;
    h.group = g.name;
    h.is_head = g.is_head;
    h.tpu = g.is_tpu();
    h.replica_hosts = g.num_of_hosts;
    for (const auto& [k, v] : g.env) h.env[k] = v;  // later entries win, as in Kubernetes
    h.resources = g.resources;
    h.object_store_bytes = g.object_store_bytes;
    h.labels = g.labels;
    h.labels[std::string(kNodeGroupLabel)] = g.name;
    return h;
  };
  {
    HostPlan h = base(spec.head);
    h.name = spec.name + "-head";
    h.fqdn = h.name + "." + sub;
    out.push_back(std::move(h));
  }
  for (const auto& g : spec.workers) {
    for (int r = 0; r < g.replicas; ++r) {
      std::vector<std::string> fqdns;
      for (int j = 0; j < g.num_of_hosts; ++j) {
        fqdns.push_back(g.name + "-" + std::to_string(r) + "-" + std::to_string(j) + "." + sub);
      }
      for (int j = 0; j < g.num_of_hosts; ++j) {
        HostPlan h = base(g);
        h.replica = r;
        h.host = j;
        h.name = g.name + "-" + std::to_string(r) + "-" + std::to_string(j);
        h.fqdn = fqdns[j];
        if (g.is_tpu()) {
          // Only variables the template leaves unset are filled (as the webhook does).
          auto set = [&](const std::string& k, const std::string& v) { h.env.emplace(k, v); };
          set("TPU_ACCELERATOR_TYPE", g.pod_type);
          set("TPU_TOPOLOGY", g.topology);
          set("TPU_NAME", g.name + "-" + std::to_string(r));
          set("TPU_WORKER_ID", std::to_string(j));
          if (g.num_of_hosts > 1) {
            std::string names;
            for (const auto& f : fqdns) names += (names.empty() ? "" : ",") + f;
            auto it = h.env.find("TPU_WORKER_HOSTNAMES");
            if (it == h.env.end() || it->second == "localhost") h.env["TPU_WORKER_HOSTNAMES"] = names;
          }
          const bool v7x = g.generation == tpu::Generation::kV7x;
          if (h.env.count("MEGASCALE_NUM_SLICES")) {
            set("MEGASCALE_SLICE_ID", std::to_string(r));
            set("MEGASCALE_COORDINATOR_ADDRESS",
                g.name + "-0-0." + sub + (v7x ? ":" + std::to_string(kMegascalePort) : ""));
            set("MEGASCALE_PORT", std::to_string(kMegascalePort));
          }
          if (v7x) {
            std::string addrs;
            for (const auto& f : fqdns) {
              addrs += (addrs.empty() ? "" : ",") + f + ":" + std::to_string(kTpuProcessPortBase);
            }
            set("TPU_PROCESS_ADDRESSES", addrs);
            set("TPU_PROCESS_PORT", std::to_string(kTpuProcessPortBase));
          }
          set("TORUS_TPU_CHIPS", std::to_string(g.tpu_chips));
          set("TORUS_TPU_METADATA_URL", "off");
        }
        out.push_back(std::move(h));
      }
    }
  }
  return out;
}

}  // namespace torus::launcher
