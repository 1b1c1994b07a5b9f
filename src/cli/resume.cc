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

void MarkSessionEnded(const std::string& session) {
  std::error_code ec;
  if (!std::filesystem::exists(HeadStore::PathIn(session), ec)) return;
  if (auto s = WriteFile(session + "/ended", "torus stop\n"); !s.ok()) {
    std::cerr << "torus: " << s.message() << " (a later head may resume session " << session << ")" << std::endl;
  }
}

StatusOr<std::string> DurableStateSummary(const std::string& session) {
  const std::string path = HeadStore::PathIn(session);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) || std::filesystem::exists(session + "/ended", ec)) return std::string();
  auto store = HeadStore::Open(path);
  if (!store.ok()) return store.status();
  const StoreKind kinds[] = {StoreKind::kActor, StoreKind::kPlacementGroup, StoreKind::kJob,
                             StoreKind::kDriverJob, StoreKind::kKv};
  const char* names[][2] = {{"actor", "actors"}, {"placement group", "placement groups"}, {"job", "jobs"},
                            {"driver", "drivers"}, {"KV key", "KV keys"}};
  std::string out;
  size_t total = 0;
  for (size_t i = 0; i < std::size(kinds); ++i) {
    auto c = (*store)->Count(kinds[i]);
    if (!c.ok()) return c.status();
    total += *c;
    out += (i ? ", " : "") + Plural(*c, names[i][0], names[i][1]);
  }
  return total ? out : std::string();
}

StatusOr<std::string> ChooseHeadSession(const Args& a) {
  std::vector<std::string> refused;
  if (a.Has("session-dir")) {
    std::string dir = a.Get("session-dir");
    auto summary = DurableStateSummary(dir);
    if (!summary.ok()) return summary.status();
    if (summary->empty()) {
      std::error_code ec;
      bool ended = std::filesystem::exists(dir + "/ended", ec);
      return InvalidArgument("--session-dir " + dir + ": " +
                             (ended ? std::string("that session ended with `torus stop`; nothing to resume")
                                    : "no durable head state there (" + HeadStore::PathIn(dir) + ") to resume"));
    }
    if (HasLiveHead(LiveSessionDaemons(dir, &refused))) {
      return FailedPrecondition("the head of session " + dir + " is still running; stop it first with `torus stop`");
    }
    std::cerr << "torus: resuming session " << dir << " (" << *summary << ")" << std::endl;
    return dir;
  }
  auto latest = FindLatestSession();
  if (!latest.ok()) return latest.status();
  if (latest->empty()) return std::string();
  auto state = DurableStateSummary(*latest);
  // A full disk is no reason to abandon a session: room made, it resumes.
  if (!state.ok() && state.status().code() == StatusCode::kResourceExhausted) return state.status();
  if (!state.ok() && !a.Has("new-session")) {
    return FailedPrecondition(state.status().message() + ". `torus start --head --new-session` starts afresh");
  }
  std::string summary = state.ok() ? *state : "damaged: " + state.status().message();
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

Status CheckResume(const Args& a, const std::string& session, const std::string& port) {
  // An empty record (left by a full disk before records were replaced atomically) names no
  // address to keep.
  const std::string old = SessionHeadAddress(session);
  if (!old.empty()) {
    std::string old_port = old.substr(old.rfind(':') + 1);
    if (old_port != port) {
      return FailedPrecondition("session " + session + " had its head at " + old +
                                "; its nodes and drivers reconnect there: resume it with --port " + old_port +
                                " (or start afresh with --new-session)");
    }
  }
  std::vector<std::string> refused;
  if (a.Has("block") && !LiveSessionDaemons(session, &refused).empty()) {
    return FailedPrecondition("session " + session + " still has daemons running; resume it without --block");
  }
  return Status::Ok();
}

}  // namespace torus
