#include "common/session_daemons.h"

#include <signal.h>

#include <filesystem>
#include <thread>

#include "common/session.h"

namespace torus {

StatusOr<pid_t> SpawnSessionDaemon(const std::string& session, const std::string& name,
                                   const std::vector<std::string>& argv,
                                   const std::map<std::string, std::string>& env_set,
                                   const std::vector<std::string>& env_unset) {
  SpawnOptions o;
  o.argv = argv;
  o.env_set = env_set;
  o.env_unset = env_unset;
  o.stdout_path = session + "/logs/" + name + ".out";
  o.stderr_path = session + "/logs/" + name + ".err";
  o.new_session = true;
  auto pid = Spawn(o);
  if (!pid.ok()) return pid.status();
  (void)WriteSessionPidFile(session, name, *pid);
  return *pid;
}

Status WriteSessionPidFile(const std::string& session, const std::string& name, pid_t pid) {
  std::error_code ec;
  std::filesystem::create_directories(session + "/pids", ec);
  return WriteFile(session + "/pids/" + name + ".pid", PidFileContent(pid));
}

std::vector<SessionDaemon> LiveSessionDaemons(const std::string& session, std::vector<std::string>* refused) {
  namespace fs = std::filesystem;
  std::vector<SessionDaemon> out;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(session + "/pids", ec)) {
    if (f.path().extension() != ".pid") continue;
    const std::string file = f.path().string();
    auto content = ReadFile(file);
    if (!content.ok()) continue;
    auto rec = ParsePidFile(*content);
    std::string why;
    PidState state = rec.ok() ? CheckSessionProcess(*rec, session, &why) : PidState::kOther;
    if (state == PidState::kSessionDaemon) {
      out.push_back({file, *rec});
      continue;
    }
    if (state == PidState::kOther) {
      refused->push_back("not signalling anything for " + file + ": " +
                         (rec.ok() ? why : rec.status().message()) + "; removed it");
    }
    fs::remove(f.path(), ec);
  }
  return out;
}

int TerminateSessionDaemons(const std::vector<SessionDaemon>& daemons, std::chrono::milliseconds grace) {
  int n = 0;
  for (const auto& d : daemons) n += kill(d.rec.pid, SIGTERM) == 0;
  auto deadline = std::chrono::steady_clock::now() + grace;
  auto same = [](const SessionDaemon& d) {
    uint64_t t = ProcessStartTime(d.rec.pid);
    return t != 0 && (d.rec.start_time == 0 || t == d.rec.start_time);
  };
  for (const auto& d : daemons) {
    while (same(d) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (same(d)) kill(d.rec.pid, SIGKILL);
    std::error_code ec;
    std::filesystem::remove(d.file, ec);
  }
  return n;
}

}  // namespace torus
