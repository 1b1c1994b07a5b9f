#include "common/session.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/ids.h"

namespace torus {

namespace fs = std::filesystem;

std::string SessionRoot() {
  const char* e = std::getenv("TORUS_TMPDIR");
  return (e && *e) ? std::string(e) : std::string("/tmp/torus");
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path + ": " + strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Status WriteFile(const std::string& path, const std::string& content, int mode) {
  std::string tmp = path + ".tmp" + std::to_string(getpid());
  FILE* f = fopen(tmp.c_str(), "w");
  if (!f) return Internal("cannot write " + tmp + ": " + strerror(errno));
  fchmod(fileno(f), mode);
  fwrite(content.data(), 1, content.size(), f);
  fclose(f);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return Internal("cannot rename " + tmp + ": " + strerror(errno));
  }
  return Status::Ok();
}

StatusOr<std::string> CreateSession(bool make_latest) {
  std::error_code ec;
  std::string root = SessionRoot();
  fs::create_directories(root, ec);
  if (ec) return Internal("cannot create " + root + ": " + ec.message());
  char stamp[64];
  time_t now = time(nullptr);
  tm t;
  localtime_r(&now, &t);
  strftime(stamp, sizeof stamp, "%Y%m%d_%H%M%S", &t);
  std::string dir = root + "/session_" + stamp + "_" + std::to_string(getpid()) + "_" + RandomHex(2);
  fs::create_directories(dir + "/logs", ec);
  if (ec) return Internal("cannot create " + dir + ": " + ec.message());
  chmod(dir.c_str(), 0700);
  if (auto s = WriteFile(dir + "/token", RandomHex(16), 0600); !s.ok()) return s;
  if (!make_latest) return dir;
  std::string link = root + "/session_latest";
  std::string tmp_link = link + ".tmp" + std::to_string(getpid());
  unlink(tmp_link.c_str());
  if (symlink(dir.c_str(), tmp_link.c_str()) == 0) rename(tmp_link.c_str(), link.c_str());
  return dir;
}

std::string LatestSession() {
  std::error_code ec;
  auto p = fs::read_symlink(SessionRoot() + "/session_latest", ec);
  if (ec) return "";
  return p.string();
}

StatusOr<std::string> FindToken(const std::string& session_dir) {
  if (const char* e = std::getenv("TORUS_TOKEN"); e && *e) return std::string(e);
  std::string dir = session_dir.empty() ? LatestSession() : session_dir;
  if (dir.empty()) {
    return Status(StatusCode::kUnauthenticated,
                  "no cluster token: TORUS_TOKEN is not set and there is no session under " +
                      SessionRoot());
  }
  auto t = ReadFile(dir + "/token");
  if (!t.ok()) {
    return Status(StatusCode::kUnauthenticated,
                  "no cluster token: TORUS_TOKEN is not set and " + t.status().message());
  }
  std::string tok = *t;
  while (!tok.empty() && (tok.back() == '\n' || tok.back() == ' ')) tok.pop_back();
  return tok;
}

std::string AddressFromEnv() {
  if (const char* e = std::getenv("TORUS_ADDRESS"); e && *e) return e;
  if (const char* e = std::getenv("RAY_ADDRESS"); e && *e) return e;
  return "";
}

}  // namespace torus
