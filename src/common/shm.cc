#include "common/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace torus {

Mapping::~Mapping() {
  if (addr_ && size_) munmap(addr_, size_);
}

StatusOr<std::unique_ptr<Mapping>> CreateSegment(const std::string& name, size_t size) {
  std::string path = "/" + name;
  int fd = shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return Internal("shm_open(" + name + "): " + strerror(errno));
  if (size > 0 && ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(path.c_str());
    return Status(StatusCode::kResourceExhausted,
                  "cannot size shared memory segment " + name + " to " + std::to_string(size) +
                      " bytes: " + strerror(e));
  }
  void* addr = nullptr;
  if (size > 0) {
    addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (addr == MAP_FAILED) {
      int e = errno;
      close(fd);
      shm_unlink(path.c_str());
      return Status(StatusCode::kResourceExhausted, "mmap " + name + ": " + strerror(e));
    }
  }
  close(fd);
  return std::make_unique<Mapping>(addr, size);
}

StatusOr<std::unique_ptr<Mapping>> OpenSegment(const std::string& name, bool writable) {
  std::string path = "/" + name;
  int fd = shm_open(path.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) return NotFound("shared memory segment " + name + ": " + strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return Internal("fstat " + name + ": " + strerror(errno));
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* addr = nullptr;
  if (size > 0) {
    addr = mmap(nullptr, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
      int e = errno;
      close(fd);
      return Internal("mmap " + name + ": " + strerror(e));
    }
  }
  close(fd);
  return std::make_unique<Mapping>(addr, size);
}

StatusOr<std::unique_ptr<Mapping>> CreateSparseSegment(const std::string& name, size_t size) {
  std::string path = "/" + name;
  int fd = shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return Internal("shm_open(" + name + "): " + strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(path.c_str());
    return Status(StatusCode::kResourceExhausted, "cannot size " + name + ": " + strerror(e));
  }
  void* addr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  int e = errno;
  close(fd);
  if (addr == MAP_FAILED) {
    shm_unlink(path.c_str());
    return Status(StatusCode::kResourceExhausted, "mmap " + name + ": " + strerror(e));
  }
  return std::make_unique<Mapping>(addr, size);
}

void ReleasePages(const Mapping& m, size_t offset, size_t size) {
  const size_t page = 4096;
  size_t start = (offset + page - 1) / page * page;
  size_t end = (offset + size) / page * page;
  if (end > start) madvise(m.data() + start, end - start, MADV_REMOVE);
}

void UnlinkSegment(const std::string& name) { shm_unlink(("/" + name).c_str()); }

int UnlinkSegmentsWithPrefix(const std::string& prefix) {
  if (prefix.empty()) return 0;
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) {
      UnlinkSegment(e->d_name);
      ++n;
    }
  }
  closedir(d);
  return n;
}

}  // namespace torus
