#include "node/spill_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace torus {

namespace fs = std::filesystem;

Status SpillFiles::Open(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Unavailable("cannot create the spill directory " + dir + ": " + ec.message());
  dir_ = dir;
  RemoveAll();
  return Status::Ok();
}

StatusOr<std::string> SpillFiles::Write(uint64_t seq, const char* data, uint64_t size) const {
  std::string path = dir_ + "/" + std::to_string(seq) + ".spill";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Status(StatusCode::kResourceExhausted,
                  "cannot create a spill file in " + dir_ + ": " + std::strerror(errno));
  }
  uint64_t done = 0;
  while (done < size) {
    ssize_t n = ::pwrite(fd, data + done, std::min<uint64_t>(size - done, 1u << 30), done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      ::unlink(path.c_str());
      return Status(StatusCode::kResourceExhausted, "spilling " + std::to_string(size) + " bytes to " +
                                                        dir_ + " failed: " + std::strerror(err));
    }
    done += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return path;
}

Status SpillFiles::Read(const std::string& path, char* dst, uint64_t size) const {
  auto fd = OpenForRead(path);
  if (!fd.ok()) return fd.status();
  uint64_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(*fd, dst + done, std::min<uint64_t>(size - done, 1u << 30), done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : 0;
      ::close(*fd);
      return Internal("restoring from " + path + " failed: " +
                      (err ? std::strerror(err) : std::string("the file is short")));
    }
    done += static_cast<uint64_t>(n);
  }
  ::close(*fd);
  return Status::Ok();
}

StatusOr<int> SpillFiles::OpenForRead(const std::string& path) const {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Internal("cannot open the spill file " + path + ": " + std::strerror(errno));
  return fd;
}

void SpillFiles::Remove(const std::string& path) const { ::unlink(path.c_str()); }

void SpillFiles::RemoveAll() const {
  if (dir_.empty()) return;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (e.path().extension() == ".spill") fs::remove(e.path(), ec);
  }
}

}  // namespace torus
