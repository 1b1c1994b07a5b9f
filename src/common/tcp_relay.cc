#include "common/tcp_relay.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "common/lane_frame.h"
#include "common/logging.h"

namespace torus {

namespace {
constexpr size_t kBuffer = 256 << 10;  // per direction; a full buffer stops reading that side

int Resolve(const std::string& host, const std::string& port, bool passive, addrinfo** res) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  return getaddrinfo(host.c_str(), port.c_str(), &hints, res);
}

// A blocking connect with a 300 ms limit, then non-blocking: the upstream is a head nearby,
// and a host that is gone must not hold the relay (or its Stop) for long.
int Dial(const std::string& address) {
  std::string host, port;
  if (!lane_internal::SplitHostPort(address, &host, &port)) return -1;
  addrinfo* res = nullptr;
  if (Resolve(host, port, false, &res) != 0 || !res) return -1;
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    timeval tv{0, 300000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  return fd;
}
}  // namespace

// One joined connection: bytes read from one side wait in that side's buffer for the other.
struct TcpRelay::Pair {
  int fd[2] = {-1, -1};     // 0: the caller, 1: the upstream
  std::string buf[2];       // buf[i]: read from fd[i], to be written to fd[1 - i]
  bool eof[2] = {false, false};
  uint64_t generation = 0;
  ~Pair() {
    for (int f : fd) {
      if (f >= 0) close(f);
    }
  }
  // Moves what it can; false when the pair is finished (an error, or both sides done).
  bool Pump(const pollfd* p) {
    for (int i = 0; i < 2; ++i) {
      // An error, or a hang-up on a side not being read (its buffer full, or done): nothing
      // more can move on this pair, and poll would report it forever.
      if (p[i].revents & (POLLERR | POLLNVAL)) return false;
      if ((p[i].revents & POLLHUP) && !(p[i].events & POLLIN)) return false;
      if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) && !eof[i] && buf[i].size() < kBuffer) {
        char chunk[64 << 10];
        ssize_t n = read(fd[i], chunk, sizeof chunk);
        if (n > 0) buf[i].append(chunk, static_cast<size_t>(n));
        else if (n == 0) eof[i] = true;
        else if (errno != EAGAIN && errno != EINTR) return false;
      }
    }
    for (int i = 0; i < 2; ++i) {
      if (!buf[i].empty()) {
        ssize_t n = send(fd[1 - i], buf[i].data(), buf[i].size(), MSG_NOSIGNAL);
        if (n > 0) buf[i].erase(0, static_cast<size_t>(n));
        else if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
      }
      if (eof[i] && buf[i].empty()) shutdown(fd[1 - i], SHUT_WR);
    }
    return !((eof[0] && buf[0].empty()) && (eof[1] && buf[1].empty()));
  }
};

StatusOr<int> TcpRelay::Start(const std::string& host, int port) {
  addrinfo* res = nullptr;
  if (Resolve(host, std::to_string(port), true, &res) != 0 || !res) {
    return InvalidArgument("cannot resolve " + host);
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 512) != 0) {
    std::string why = strerror(errno);
    freeaddrinfo(res);
    if (fd >= 0) close(fd);
    return Unavailable("cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
  }
  freeaddrinfo(res);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  int bound = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(fd);
    return Internal(std::string("relay: pipe: ") + strerror(errno));
  }
  listen_fd_ = fd;
  thread_ = std::thread([this] { Loop(); });
  return bound;
}

void TcpRelay::SetUpstream(const std::string& address) {
  {
    MutexLock lock(mu_);
    upstream_ = address;
    ++generation_;
  }
  if (wake_[1] >= 0) (void)!write(wake_[1], "u", 1);
}

void TcpRelay::Stop() {
  {
    MutexLock lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  if (wake_[1] >= 0) (void)!write(wake_[1], "s", 1);
  if (thread_.joinable()) thread_.join();
  for (int& f : wake_) {
    if (f >= 0) close(f);
    f = -1;
  }
}

void TcpRelay::Loop() {
  using Clock = std::chrono::steady_clock;
  std::vector<std::unique_ptr<Pair>> pairs;
  std::vector<pollfd> fds;
  Clock::time_point accept_after{};
  for (;;) {
    std::string upstream;
    uint64_t generation;
    {
      MutexLock lock(mu_);
      if (stop_) break;
      upstream = upstream_;
      generation = generation_;
    }
    std::erase_if(pairs, [&](const auto& p) { return p->generation != generation; });
    fds.assign({{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}});
    for (const auto& p : pairs) {
      for (int i = 0; i < 2; ++i) {
        short ev = 0;
        if (!p->eof[i] && p->buf[i].size() < kBuffer) ev |= POLLIN;
        if (!p->buf[1 - i].empty()) ev |= POLLOUT;
        fds.push_back({p->fd[i], ev, 0});
      }
    }
    const bool accepting = Clock::now() >= accept_after;
    if (!accepting) fds[0].events = 0;
    if (poll(fds.data(), fds.size(), accepting ? -1 : 100) < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) {
      char drain[64];
      while (read(wake_[0], drain, sizeof drain) > 0) {
      }
      MutexLock lock(mu_);
      if (stop_ || generation_ != generation) continue;  // nothing more moves to an old upstream
    }
    for (size_t i = 0, k = 2; i < pairs.size(); ++i, k += 2) {
      if (!pairs[i]->Pump(&fds[k])) pairs[i].reset();
    }
    std::erase_if(pairs, [](const auto& p) { return !p; });
    if (fds[0].revents & POLLIN) {
      for (int n = 0; n < 16; ++n) {  // a few per round: Stop and the pairs are not kept waiting
        {
          MutexLock lock(mu_);
          if (stop_) break;
        }
        int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) {
          // Out of descriptors: the listener stays readable; stop accepting for a while.
          if (errno == EMFILE || errno == ENFILE) accept_after = Clock::now() + std::chrono::milliseconds(100);
          break;
        }
        int u = upstream.empty() ? -1 : Dial(upstream);
        if (u < 0) {
          close(c);  // no active head to join: the caller retries
          continue;
        }
        int one = 1;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        auto p = std::make_unique<Pair>();
        p->fd[0] = c;
        p->fd[1] = u;
        p->generation = generation;
        pairs.push_back(std::move(p));
        ++joined_;
      }
    }
  }
  pairs.clear();
  close(listen_fd_);
  listen_fd_ = -1;
}

}  // namespace torus
