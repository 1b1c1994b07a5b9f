#include "cli/flags.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/head_addresses.h"
#include "common/json_limits.h"
#include "common/labels.h"
#include "common/rpc.h"
#include "common/session.h"
#include "common/session_daemons.h"

namespace torus {

namespace {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string ClosestFlag(const std::string& flag, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = 3;
  for (const auto& k : known) {
    size_t d = EditDistance(flag, k);
    if (d < best_d && d * 3 <= flag.size() + 2) {
      best = k;
      best_d = d;
    }
  }
  return best;
}

std::string UnknownFlagMessage(const std::map<std::string, std::string>& given,
                               const std::vector<std::string>& known) {
  for (const auto& [k, v] : given) {
    if (std::find(known.begin(), known.end(), k) != known.end()) continue;
    std::string msg = "unknown flag --" + k;
    std::string close = ClosestFlag(k, known);
    if (!close.empty()) msg += " (did you mean --" + close + "?)";
    return msg;
  }
  return "";
}

void RequireKnownFlags(const std::string& command, const std::map<std::string, std::string>& given,
                       const std::vector<std::string>& known) {
  std::string msg = UnknownFlagMessage(given, known);
  if (msg.empty()) return;
  std::cerr << "torus " << command << ": " << msg << "\n(see torus " << command << " --help)" << std::endl;
  exit(2);
}

Args ParseArgs(int argc, char** argv, int from, const std::set<std::string>& bool_flags) {
  Args a;
  for (int i = from; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "--") {
      a.after_dashes.assign(argv + i + 1, argv + argc);
      break;
    }
    if (s.rfind("--", 0) == 0) {
      std::string k = s.substr(2), v = "1";
      auto eq = k.find('=');
      if (eq != std::string::npos) {
        v = k.substr(eq + 1);
        k = k.substr(0, eq);
      } else if (!bool_flags.count(k) && i + 1 < argc) {
        v = argv[++i];
      }
      a.flags[k] = v;
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

[[noreturn]] void Die(const std::string& msg) {
  std::cerr << "torus: " << msg << std::endl;
  ReportDaemonFailed(msg);  // a daemon's error reaches the command that started it
  exit(1);
}

int PortFlag(const Args& a, const std::string& flag, int def) {
  std::string v = a.Get(flag, std::to_string(def));
  try {
    size_t used = 0;
    int p = std::stoi(v, &used);
    if (used == v.size() && p >= 0 && p <= 65535) return p;
  } catch (...) {
  }
  Die("--" + flag + " must be a port number between 0 and 65535, got '" + v + "'");
}

int PositiveIntFlag(const Args& a, const std::string& flag, int def) {
  std::string v = a.Get(flag, std::to_string(def));
  try {
    size_t used = 0;
    int n = std::stoi(v, &used);
    if (used == v.size() && n > 0) return n;
  } catch (...) {
  }
  Die("--" + flag + " must be a positive integer, got '" + v + "'");
}

StatusOr<ResourceDoubles> ParseResources(const Args& a) {
  ResourceDoubles r;
  if (a.Has("resources")) {
    auto parsed = ParseJson(a.Get("resources"), "--resources");
    if (!parsed.ok()) {
      return InvalidArgument(parsed.status().message() + "; expected e.g. '{\"GPU\": 1, \"custom\": 2}'");
    }
    const nlohmann::json& j = *parsed;
    if (!j.is_object()) return InvalidArgument("--resources must be a JSON object of name: amount");
    for (auto& [k, v] : j.items()) {
      if (!v.is_number()) {
        return InvalidArgument("--resources: amount of '" + k + "' is " + v.dump() +
                               "; expected a number >= 0");
      }
      r[k] = v.get<double>();
    }
    if (auto s = ValidateResources(r, "--resources"); !s.ok()) return s;
  }
  static const std::pair<const char*, const char*> kAmountFlags[] = {
      {"num-cpus", "CPU"}, {"num-gpus", "GPU"}, {"memory", "memory"}};
  for (const auto& [flag, name] : kAmountFlags) {
    if (!a.Has(flag)) continue;
    auto v = ParseResourceAmount(name, a.Get(flag), std::string("--") + flag);
    if (!v.ok()) return v.status();
    r[name] = *v;
  }
  return r;
}

StatusOr<std::map<std::string, std::string>> ParseLabels(const std::string& s) {
  std::map<std::string, std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgument("--labels entry '" + item + "' is not key=value");
    }
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  if (auto st = ValidateUserLabels(out, "--labels"); !st.ok()) return st;
  return out;
}

std::string FirstReachable(const std::string& list) {
  const std::vector<std::string> heads = HeadAddresses::Split(list);
  if (heads.size() <= 1) return heads.empty() ? list : heads[0];
  for (const auto& h : heads) {
    auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(1000);
    if (GetOneOffChannel(h)->WaitForConnected(deadline)) return h;
  }
  return heads[0];  // none answers: the caller reports the first
}

std::string ResolveAddress(const Args& a, bool* from_session) {
  std::string addr = a.Get("address");
  if (addr.empty()) addr = AddressFromEnv();
  if (addr.empty()) {
    auto latest = LatestHeadAddress();
    if (!latest.ok()) Die(latest.status().message());
    addr = *latest;
    if (from_session) *from_session = !addr.empty();
  }
  while (!addr.empty() && (addr.back() == '\n' || addr.back() == ' ')) addr.pop_back();
  return FirstReachable(addr);
}

}  // namespace torus
