#include "common/shm_owner.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <string>

#include "common/session.h"
#include "common/shm.h"

namespace torus {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockSuffix = "lock";

// A descriptor locking `path` when nobody else held its lock (the owner died), else -1.
int LockIfOwnerGone(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
  close(fd);
  return -1;
}

bool OwnerGone(const std::string& path) {
  int fd = LockIfOwnerGone(path);
  if (fd >= 0) close(fd);
  return fd >= 0;
}

// True when `fd` is still the file at `path` (a cleaner did not remove it meanwhile).
bool SameFile(int fd, const std::string& path) {
  struct stat a, b;
  return fstat(fd, &a) == 0 && stat(path.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

uint64_t ReadBytes(const std::string& path) {
  auto r = ReadFile(path);
  if (!r.ok()) return 0;
  try {
    return std::stoull(*r);
  } catch (...) {
    return 0;
  }
}

bool IsLockFile(const fs::path& p) {
  std::string n = p.filename().string();
  return n.rfind("torus.", 0) == 0 && n.size() > 4 && n.substr(n.size() - 4) == kLockSuffix;
}

}  // namespace

ShmOwnerLock::~ShmOwnerLock() {
  if (fd_ >= 0) close(fd_);
}

ShmOwnerLock& ShmOwnerLock::operator=(ShmOwnerLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

StatusOr<ShmOwnerLock> ShmOwnerLock::Acquire(const std::string& session_dir, const std::string& prefix,
                                             uint64_t arena_bytes) {
  std::error_code ec;
  fs::create_directories(session_dir + "/shm", ec);
  ShmOwnerLock l;
  l.path_ = session_dir + "/shm/" + prefix + kLockSuffix;
  // A cleaner (a sibling node starting, `torus stop`, `torus down`) may take the file just
  // created for a dead owner's: it locks it for a moment and removes it. Retry then, on the new
  // file; node ids are random, so a holder that stays is a true conflict. Without these
  // retries a node of a crowded start ran without its lock, its segments invisible to cleaners.
  for (int attempt = 0; attempt < 200; ++attempt) {
    if (l.fd_ >= 0) close(l.fd_);
    l.fd_ = open(l.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (l.fd_ < 0) return Internal("cannot create " + l.path_ + ": " + strerror(errno));
    if (flock(l.fd_, LOCK_EX | LOCK_NB) != 0) {
      usleep(5000);
      continue;
    }
    if (SameFile(l.fd_, l.path_)) {
      l.SetArenaBytes(arena_bytes);
      return l;
    }
  }
  return FailedPrecondition("cannot hold " + l.path_ + ": another process holds it or keeps removing it");
}

void ShmOwnerLock::SetArenaBytes(uint64_t arena_bytes) {
  if (fd_ < 0) return;
  std::string s = std::to_string(arena_bytes);
  if (ftruncate(fd_, 0) == 0) (void)!pwrite(fd_, s.data(), s.size(), 0);
}

void ShmOwnerLock::Release() {
  if (fd_ < 0) return;
  std::error_code ec;
  fs::remove(path_, ec);
  close(fd_);
  fd_ = -1;
}

int CleanDeadNodeSegments(const std::string& session_dir) {
  int removed = 0;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(session_dir + "/shm", ec)) {
    if (!IsLockFile(f.path())) continue;
    int fd = LockIfOwnerGone(f.path().string());
    if (fd < 0) continue;
    std::string name = f.path().filename().string();
    removed += UnlinkSegmentsWithPrefix(name.substr(0, name.size() - 4));  // "torus.<id12>."
    fs::remove(f.path(), ec);  // under our lock, so a restarting owner retries on a new file
    close(fd);
  }
  return removed;
}

std::vector<uint64_t> LiveArenaBytes(const std::string& session_root) {
  std::vector<uint64_t> out;
  std::error_code ec;
  for (const auto& s : fs::directory_iterator(session_root, ec)) {
    if (s.is_symlink() || s.path().filename().string().rfind("session_", 0) != 0) continue;
    for (const auto& f : fs::directory_iterator(s.path() / "shm", ec)) {
      if (IsLockFile(f.path()) && !OwnerGone(f.path().string())) out.push_back(ReadBytes(f.path().string()));
    }
  }
  return out;
}

}  // namespace torus
