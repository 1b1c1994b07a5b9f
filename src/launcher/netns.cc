#include "launcher/netns.h"

#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/ids.h"
#include "common/process.h"
#include "common/session.h"

namespace torus::launcher {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string IpBinary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

Status RunCommand(const std::vector<std::string>& argv, const std::string& log) {
  std::string out = log + ".last";
  SpawnOptions o;
  o.argv = argv;
  o.stdout_path = out;
  o.stderr_path = out;
  fs::remove(out);
  auto pid = Spawn(o);
  if (!pid.ok()) return pid.status();
  int status = 0;
  while (waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::string text = ReadFile(out).ok() ? *ReadFile(out) : "";
  std::string cmd;
  for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  {
    std::ofstream l(log, std::ios::app);
    l << "$ " << cmd << "\n" << text;
  }
  fs::remove(out);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  return Internal("`" + cmd + "` " + DescribeWaitStatus(status) + ": " + Trim(text));
}

std::string HostsTable(const json& state) {
  std::string t = "127.0.0.1 localhost\n::1 localhost\n";
  for (const auto& h : state["hosts"]) {
    t += h["ip"].get<std::string>() + " " + h["fqdn"].get<std::string>() + " " + h["name"].get<std::string>() + "\n";
  }
  return t;
}

Status SetUpNetns(const std::string& session, json& state) {
  const std::string ip = IpBinary();
  if (ip.empty()) return FailedPrecondition("--netns needs the `ip` command (iproute2)");
  const std::string log = session + "/logs/netns.log";
  const std::string id = state["netns_id"];
  const std::string bridge = state["bridge"];
  std::vector<std::string> nss;
  for (const auto& h : state["hosts"]) {
    if (!h["netns"].get<std::string>().empty()) nss.push_back(h["netns"]);
  }
  if (auto s = RunCommand({ip, "link", "add", bridge, "type", "bridge"}, log); !s.ok()) return s;
  std::string subnet = state["subnet"];
  if (auto s = RunCommand({ip, "addr", "add", subnet + ".1/24", "dev", bridge}, log); !s.ok()) return s;
  if (auto s = RunCommand({ip, "link", "set", bridge, "up"}, log); !s.ok()) return s;
  for (const auto& ns : nss) {
    if (auto s = RunCommand({ip, "netns", "add", ns}, log); !s.ok()) return s;
  }
  // Veth pairs: "v<id>.<k>" stays in the bridge, "p<id>.<k>" moves into the namespace as eth0.
  std::string batch;
  for (size_t k = 0; k < nss.size(); ++k) {
    std::string v = "v" + id + "." + std::to_string(k), p = "p" + id + "." + std::to_string(k);
    batch += "link add " + v + " type veth peer name " + p + "\n";
    batch += "link set " + p + " netns " + nss[k] + "\n";
    batch += "link set " + v + " master " + bridge + " up\n";
  }
  std::string batch_file = session + "/launcher/netns.batch";
  if (auto s = WriteFile(batch_file, batch); !s.ok()) return s;
  if (auto s = RunCommand({ip, "-batch", batch_file}, log); !s.ok()) return s;
  const std::string table = HostsTable(state);
  size_t k = 0;
  for (const auto& h : state["hosts"]) {
    std::string ns = h["netns"];
    if (ns.empty()) continue;
    std::string p = "p" + id + "." + std::to_string(k++);
    std::string inner = "link set lo up\nlink set " + p + " name eth0\naddr add " + h["ip"].get<std::string>() +
                        "/24 dev eth0\nlink set eth0 up\nroute add default via " + subnet + ".1\n";
    std::string f = session + "/launcher/netns-" + h["name"].get<std::string>() + ".batch";
    if (auto s = WriteFile(f, inner); !s.ok()) return s;
    if (auto s = RunCommand({ip, "-n", ns, "-batch", f}, log); !s.ok()) return s;
    std::error_code ec;
    fs::create_directories("/etc/netns/" + ns, ec);
    if (ec) return Internal("cannot create /etc/netns/" + ns + ": " + ec.message());
    if (auto s = WriteFile("/etc/netns/" + ns + "/hosts", table); !s.ok()) return s;
  }
  return Status::Ok();
}

int TearDownNetns(const std::string& session, const json& state) {
  if (!state.value("netns", false)) return 0;
  const std::string ip = IpBinary();
  if (ip.empty()) return 0;
  const std::string log = session + "/logs/netns.log";
  int removed = 0;
  std::set<std::string> existing;
  {
    DIR* d = opendir("/run/netns");
    while (d && true) {
      dirent* e = readdir(d);
      if (!e) break;
      existing.insert(e->d_name);
    }
    if (d) closedir(d);
  }
  for (const auto& h : state["hosts"]) {
    std::string ns = h.value("netns", "");
    if (ns.empty()) continue;
    if (existing.count(ns) && RunCommand({ip, "netns", "del", ns}, log).ok()) ++removed;
    std::error_code ec;
    fs::remove_all("/etc/netns/" + ns, ec);
  }
  std::string bridge = state.value("bridge", "");
  if (!bridge.empty() && fs::exists("/sys/class/net/" + bridge)) {
    (void)RunCommand({ip, "link", "del", bridge}, log);
  }
  return removed;
}

std::string PickSubnet() {
  auto fib = ReadFile("/proc/net/fib_trie");
  const std::string addrs = fib.ok() ? *fib : "";
  for (int attempt = 0; attempt < 64; ++attempt) {
    std::string hex = RandomHex(2);
    int a = 100 + static_cast<int>(std::stoul(hex.substr(0, 2), nullptr, 16)) % 100;
    int b = static_cast<int>(std::stoul(hex.substr(2, 2), nullptr, 16));
    std::string subnet = "10." + std::to_string(a) + "." + std::to_string(b);
    if (addrs.find(" " + subnet + ".") == std::string::npos) return subnet;
  }
  return "10.199.254";
}

}  // namespace torus::launcher
