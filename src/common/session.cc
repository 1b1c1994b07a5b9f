#include "common/session.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
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

namespace {
// The error of a failed write of `path`: a full disk says so in words every caller passes on.
Status WriteError(const std::string& path, int e) {
  if (e == ENOSPC) return Status(StatusCode::kResourceExhausted, "no space left on device writing " + path);
  if (e == EDQUOT) return Status(StatusCode::kResourceExhausted, "disk quota exceeded writing " + path);
  return Internal("cannot write " + path + ": " + strerror(e));
}

// Makes a rename in `dir` durable; filesystems that cannot sync a directory are taken as they are.
int SyncDirectory(const std::string& dir) {
  int fd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int e = fsync(fd) == 0 || errno == EINVAL ? 0 : errno;
  close(fd);
  return e;
}
}  // namespace

Status WriteFile(const std::string& path, const std::string& content, int mode) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp" + std::to_string(getpid()) + "." + std::to_string(counter++);
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode & 07777);
  if (fd < 0) return WriteError(path, errno);
  auto fail = [&](int e) {
    if (fd >= 0) close(fd);
    unlink(tmp.c_str());
    return WriteError(path, e);
  };
  if (fchmod(fd, static_cast<mode_t>(mode & 07777)) != 0) return fail(errno);  // whatever the umask
  for (size_t done = 0; done < content.size();) {
    ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(n < 0 ? errno : ENOSPC);
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return fail(errno);
  int rc = close(fd);
  fd = -1;
  if (rc != 0) return fail(errno);
  if (rename(tmp.c_str(), path.c_str()) != 0) return fail(errno);
  if (int e = SyncDirectory(fs::path(path).parent_path().string()); e != 0) return WriteError(path, e);
  return Status::Ok();
}

namespace {
// `path` is a directory owned by this user that no other user may write to (following one
// symlink, itself owned by this user). `what` names it in the error.
Status CheckPrivateDir(const std::string& path, const std::string& what) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return Internal("cannot stat " + what + " " + path + ": " + strerror(errno));
  const uid_t me = geteuid();
  const std::string fix = "; remove it, or set TORUS_TMPDIR to a directory of your own";
  if (S_ISLNK(st.st_mode)) {
    if (st.st_uid != me) {
      return FailedPrecondition(what + " " + path + " is a symlink owned by uid " + std::to_string(st.st_uid) +
                                ", not by you (uid " + std::to_string(me) + ")" + fix);
    }
    if (stat(path.c_str(), &st) != 0) return Internal("cannot stat " + what + " " + path + ": " + strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) return FailedPrecondition(what + " " + path + " is not a directory" + fix);
  if (st.st_uid != me) {
    return FailedPrecondition(what + " " + path + " is owned by uid " + std::to_string(st.st_uid) +
                              ", not by you (uid " + std::to_string(me) + ")" + fix);
  }
  if (st.st_mode & 022) {
    char mode[8];
    snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return FailedPrecondition(what + " " + path + " is writable by other users (mode " + mode +
                              "); chmod go-w it, or set TORUS_TMPDIR to a directory of your own");
  }
  return Status::Ok();
}
}  // namespace

Status CheckSessionRoot() {
  std::string root = SessionRoot();
  struct stat st;
  if (lstat(root.c_str(), &st) != 0 && errno == ENOENT) return Status::Ok();
  return CheckPrivateDir(root, "the session root");
}

StatusOr<std::string> CreateSession(bool make_latest) {
  std::error_code ec;
  std::string root = SessionRoot();
  if (auto parent = fs::path(root).parent_path(); !parent.empty()) fs::create_directories(parent, ec);
  if (mkdir(root.c_str(), 0700) != 0 && errno != EEXIST) {
    return Internal("cannot create " + root + ": " + strerror(errno));
  }
  if (auto s = CheckSessionRoot(); !s.ok()) return s;
  char stamp[64];
  time_t now = time(nullptr);
  tm t;
  localtime_r(&now, &t);
  strftime(stamp, sizeof stamp, "%Y%m%d_%H%M%S", &t);
  std::string dir = root + "/session_" + stamp + "_" + std::to_string(getpid()) + "_" + RandomHex(2);
  if (mkdir(dir.c_str(), 0700) != 0) return Internal("cannot create " + dir + ": " + strerror(errno));
  fs::create_directories(dir + "/logs", ec);
  if (ec) return Internal("cannot create " + dir + "/logs: " + ec.message());
  if (auto s = WriteFile(dir + "/token", RandomHex(16), 0600); !s.ok()) return s;
  if (make_latest) {
    if (auto s = MakeLatestSession(dir); !s.ok()) return s;
  }
  return dir;
}

Status MakeLatestSession(const std::string& dir) {
  std::string link = SessionRoot() + "/session_latest";
  std::string tmp_link = link + ".tmp" + std::to_string(getpid());
  unlink(tmp_link.c_str());
  if (symlink(dir.c_str(), tmp_link.c_str()) != 0 || rename(tmp_link.c_str(), link.c_str()) != 0) {
    return Internal("cannot point " + link + " at " + dir + ": " + strerror(errno));
  }
  return Status::Ok();
}

StatusOr<std::string> FindLatestSession() {
  if (auto s = CheckSessionRoot(); !s.ok()) return s;
  std::string link = SessionRoot() + "/session_latest";
  struct stat st;
  if (lstat(link.c_str(), &st) != 0) return std::string();
  if (!S_ISLNK(st.st_mode)) return FailedPrecondition(link + " is not a symlink; remove it");
  if (st.st_uid != geteuid()) {
    return FailedPrecondition(link + " is owned by uid " + std::to_string(st.st_uid) + ", not by you (uid " +
                              std::to_string(geteuid()) + "); remove it");
  }
  std::error_code ec;
  auto p = fs::read_symlink(link, ec);
  if (ec) return std::string();
  if (lstat(p.c_str(), &st) != 0) return p.string();  // dangling: callers report what is missing
  if (auto s = CheckPrivateDir(p.string(), "the latest session"); !s.ok()) return s;
  return p.string();
}

std::string LatestSession() {
  auto s = FindLatestSession();
  return s.ok() ? *s : std::string();
}

Status ValidateToken(std::string_view token, const std::string& source) {
  if (token.empty()) {
    return Status(StatusCode::kUnauthenticated, "no cluster token: " + source + " is empty");
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const auto b = static_cast<unsigned char>(token[i]);
    if (b >= 0x20 && b < 0x7f) continue;
    char what[80];
    std::snprintf(what, sizeof what, "%s (byte 0x%02x at offset %zu)",
                  b < 0x20 || b == 0x7f ? "a control character" : "a byte that is not ASCII", b, i);
    return Status(StatusCode::kUnauthenticated,
                  "the cluster token in " + source + " contains " + what + "; tokens are printable ASCII");
  }
  if (token.size() < kMinTokenLength) {
    return Status(StatusCode::kUnauthenticated,
                  "the cluster token in " + source + " is too short (" + std::to_string(token.size()) +
                      " characters; at least " + std::to_string(kMinTokenLength) + " are needed)");
  }
  return Status::Ok();
}

StatusOr<std::string> CleanToken(std::string_view raw, const std::string& source) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; };
  while (!raw.empty() && space(raw.front())) raw.remove_prefix(1);
  while (!raw.empty() && space(raw.back())) raw.remove_suffix(1);
  if (auto s = ValidateToken(raw, source); !s.ok()) return s;
  return std::string(raw);
}

StatusOr<std::string> ReadTokenFile(const std::string& session_dir) {
  auto t = ReadFile(session_dir + "/token");
  if (!t.ok()) return Status(StatusCode::kUnauthenticated, "no cluster token: " + t.status().message());
  return CleanToken(*t, "the token file " + session_dir + "/token");
}

StatusOr<std::string> FindToken(const std::string& session_dir) {
  if (const char* e = std::getenv("TORUS_TOKEN"); e && *e) return CleanToken(e, "TORUS_TOKEN");
  std::string dir = session_dir;
  if (dir.empty()) {
    auto latest = FindLatestSession();
    if (!latest.ok()) {
      return Status(StatusCode::kUnauthenticated,
                    "no cluster token: TORUS_TOKEN is not set and " + latest.status().message());
    }
    dir = *latest;
  }
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
  return CleanToken(*t, "the token file " + dir + "/token");
}

std::string AddressFromEnv() {
  if (const char* e = std::getenv("TORUS_ADDRESS"); e && *e) return e;
  if (const char* e = std::getenv("RAY_ADDRESS"); e && *e) return e;
  return "";
}

std::string SessionHeadAddress(const std::string& session_dir) {
  auto r = ReadFile(session_dir + "/head_address");
  if (!r.ok()) return "";
  std::string a = *r;
  while (!a.empty() && (a.back() == '\n' || a.back() == ' ')) a.pop_back();
  return a;
}

StatusOr<std::string> LatestHeadAddress() {
  auto latest = FindLatestSession();
  if (!latest.ok()) return latest.status();
  return latest->empty() ? std::string() : SessionHeadAddress(*latest);
}

}  // namespace torus
