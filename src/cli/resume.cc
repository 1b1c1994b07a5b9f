#include "cli/resume.h"

#include <filesystem>
#include <iostream>

#include "common/session.h"
#include "common/session_daemons.h"
#include "head/head_store.h"

namespace torus {

namespace {
std::string Plural(size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

bool HasLiveHead(const std::vector<SessionDaemon>& live) {
  for (const auto& d : live) {
    if (std::filesystem::path(d.file).stem() == "head") return true;
  }
  return false;
}
}  // namespace

std::string DurableStateSummary(const std::string& session) {
  const std::string path = HeadStore::PathIn(session);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return "";
  auto store = HeadStore::Open(path);
  if (!store.ok()) return "";
  size_t n[4] = {};
  const StoreKind kinds[4] = {StoreKind::kActor, StoreKind::kPlacementGroup, StoreKind::kDriverJob, StoreKind::kKv};
  for (int i = 0; i < 4; ++i) {
    auto c = (*store)->Count(kinds[i]);
    n[i] = c.ok() ? *c : 0;
  }
  if (!n[0] && !n[1] && !n[2] && !n[3]) return "";
  return Plural(n[0], "actor", "actors") + ", " + Plural(n[1], "placement group", "placement groups") +
         ", " + Plural(n[2], "driver", "drivers") + ", " + Plural(n[3], "KV key", "KV keys");
}

StatusOr<std::string> ChooseHeadSession(const Args& a) {
  std::vector<std::string> refused;
  if (a.Has("session-dir")) {
    std::string dir = a.Get("session-dir");
    if (DurableStateSummary(dir).empty()) {
      return InvalidArgument("--session-dir " + dir + ": no durable head state there (" +
                             HeadStore::PathIn(dir) + ") to resume");
    }
    if (HasLiveHead(LiveSessionDaemons(dir, &refused))) {
      return FailedPrecondition("the head of session " + dir + " is still running; stop it first with `torus stop`");
    }
    std::cerr << "torus: resuming session " << dir << " (" << DurableStateSummary(dir) << ")" << std::endl;
    return dir;
  }
  auto latest = FindLatestSession();
  if (!latest.ok()) return latest.status();
  if (latest->empty()) return std::string();
  std::string summary = DurableStateSummary(*latest);
  auto live = LiveSessionDaemons(*latest, &refused);
  if (summary.empty() || HasLiveHead(live)) return std::string();  // nothing to resume, or refused later
  if (a.Has("new-session")) {
    std::cerr << "torus: starting a new session; abandoning session " << *latest << " and its state ("
              << summary << ")";
    if (!live.empty()) std::cerr << "; stopping its " << Plural(live.size(), "daemon", "daemons") << " still running";
    std::cerr << std::endl;
    TerminateSessionDaemons(live, std::chrono::seconds(3));
    return std::string();
  }
  std::cerr << "torus: resuming session " << *latest << " (" << summary
            << "); `torus start --head --new-session` starts afresh instead" << std::endl;
  return *latest;
}

}  // namespace torus
