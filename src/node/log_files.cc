#include "node/log_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace torus {

namespace {
constexpr int64_t kDefaultReadBytes = 1 << 20;
constexpr int64_t kMaxReadBytes = 4 << 20;

std::string BaseName(const std::string& path) { return std::filesystem::path(path).filename().string(); }

bool StartsWith(const std::string& s, std::string_view p) { return s.compare(0, p.size(), p) == 0; }
}  // namespace

void LogFiles::Claim(const std::string& path, const std::string& kind, const std::string& worker_id,
                     const std::string& job_id) {
  const std::string name = BaseName(path);
  if (name.empty()) return;
  MutexLock lock(mu_);
  auto [it, fresh] = by_name_.insert_or_assign(name, Entry{path, kind, worker_id, job_id});
  // The node's own files stay for its life; the others are bounded, oldest first.
  if (!fresh || kind == "node") return;
  order_.push_back(name);
  while (order_.size() > kMaxClaims) {
    by_name_.erase(order_.front());
    order_.pop_front();
  }
}

void LogFiles::ClaimOwnOutput() {
  for (int fd : {1, 2}) {
    std::error_code ec;
    auto target = std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(fd), ec);
    if (ec || !std::filesystem::is_regular_file(target, ec)) continue;
    Claim(target.string(), "node");
  }
}

bool LogFiles::SessionFileName(const std::string& name) {
  return !StartsWith(name, "node-") && !StartsWith(name, "worker-") && !StartsWith(name, "job-") &&
         name[0] != '.';
}

rpc::LogFileList LogFiles::List() const {
  std::map<std::string, Entry> all;
  {
    MutexLock lock(mu_);
    all = by_name_;
  }
  if (!session_logs_dir_.empty()) {
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(session_logs_dir_, ec)) {
      const std::string name = f.path().filename().string();
      if (!f.is_regular_file(ec) || f.is_symlink(ec) || !SessionFileName(name) || all.count(name)) continue;
      all[name] = Entry{f.path().string(), "session", "", ""};
    }
  }
  rpc::LogFileList out;
  for (const auto& [name, e] : all) {
    struct stat st {};
    if (::lstat(e.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // no links, pipes
    rpc::LogFile* f = out.add_files();
    f->set_name(name);
    f->set_size(st.st_size);
    f->set_mtime_ms(static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000);
    f->set_kind(e.kind);
    f->set_worker_id(e.worker_id);
    f->set_job_id(e.job_id);
  }
  return out;
}

std::string LogFiles::PathOf(const std::string& name, Entry* entry) const {
  {
    MutexLock lock(mu_);
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      *entry = it->second;
      return it->second.path;
    }
  }
  if (session_logs_dir_.empty() || name.empty() || !SessionFileName(name) ||
      name.find('/') != std::string::npos || name == "..") {
    return "";
  }
  return session_logs_dir_ + "/" + name;
}

Status LogFiles::Read(const rpc::ReadLogRequest& req, rpc::ReadLogReply* out) const {
  Entry e;
  const std::string path = PathOf(req.name(), &e);
  if (path.empty()) return NotFound("no log file named '" + req.name() + "' on this node");
  // A regular file only, not through a link (a link or pipe put in the logs directory by a job
  // is neither listed nor read), and never blocking on open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return NotFound("log file '" + req.name() + "' cannot be opened on this node: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return NotFound("log file '" + req.name() + "' is not a regular file on this node");
  }
  const int64_t size = st.st_size;
  int64_t offset = req.offset();
  if (offset < 0) offset = TailOffset(fd, size, std::max(0, req.tail_lines()));
  offset = std::min(offset, size);
  int64_t want = req.max_bytes() > 0 ? std::min<int64_t>(req.max_bytes(), kMaxReadBytes) : kDefaultReadBytes;
  want = std::min(want, size - offset);
  std::string data(static_cast<size_t>(want), '\0');
  int64_t got = 0;
  while (got < want) {
    const ssize_t n = ::pread(fd, data.data() + got, static_cast<size_t>(want - got), offset + got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Internal("reading log file '" + req.name() + "': " + std::strerror(errno));
    if (n == 0) break;
    got += n;
  }
  data.resize(static_cast<size_t>(got));
  out->set_data(std::move(data));
  out->set_offset(offset);
  out->set_size(size);
  return Status::Ok();
}

int64_t TailOffset(int fd, int64_t size, int lines) {
  if (lines <= 0 || size == 0) return size;
  // Walk back in blocks counting newlines; a final newline ends the last line, it does not start
  // an empty one. At most kMaxTailScan bytes back: a file of few, huge lines (progress bars)
  // starts there.
  constexpr int64_t kBlock = 64 * 1024;
  std::vector<char> buf(kBlock);
  const int64_t floor = std::max<int64_t>(0, size - kMaxTailScan);
  int64_t pos = size;
  int seen = 0;
  bool first_char = true;
  while (pos > floor) {
    const int64_t n = std::min(kBlock, pos - floor);
    pos -= n;
    if (::pread(fd, buf.data(), static_cast<size_t>(n), pos) != n) return pos;
    for (int64_t i = n - 1; i >= 0; --i) {
      if (buf[i] != '\n') {
        first_char = false;
        continue;
      }
      if (first_char) {
        first_char = false;
        continue;
      }
      if (++seen == lines) return pos + i + 1;
    }
  }
  return floor;
}

}  // namespace torus
