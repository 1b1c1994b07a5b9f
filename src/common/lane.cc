#include "common/lane.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <random>

#include "common/logging.h"

namespace torus {

// Bytes received on one connection and the frames in them: one read() takes whatever has
// arrived (usually a whole frame), instead of one read per header, text and payload.
class LaneInbox {
 public:
  // 1: a whole frame of one of the `kinds` (bit 1 << kind) starts at the read position (h, text, payload point into the
  // buffer until the next Fill or Next; the position moves past it); 0: more bytes needed;
  // -1: the bytes are not a valid frame (*why says how).
  int Next(uint32_t kinds, LaneHeader* h, std::string_view* text, std::string_view* payload, std::string* why) {
    if (len_ - pos_ < sizeof(LaneHeader)) return 0;
    memcpy(h, data_.get() + pos_, sizeof *h);
    if (h->magic != kLaneMagic || h->kind > 31 || !(kinds & (1u << h->kind)) || h->text_len > kLaneMaxText ||
        h->payload_len > kLaneMaxPayload ||
        ((h->kind == kLaneCall || h->kind == kLaneOpen) && h->text_len == 0)) {
      *why = "malformed frame (magic " + std::to_string(h->magic) + ", kind " + std::to_string(h->kind) +
             ", text " + std::to_string(h->text_len) + " bytes, payload " + std::to_string(h->payload_len) +
             " bytes)";
      return -1;
    }
    size_t total = sizeof(LaneHeader) + h->text_len + h->payload_len;
    if (len_ - pos_ < total) {
      if (cap_ - pos_ < total) Make(total);
      return 0;
    }
    const char* p = data_.get() + pos_ + sizeof(LaneHeader);
    *text = std::string_view(p, h->text_len);
    *payload = std::string_view(p + h->text_len, h->payload_len);
    pos_ += total;
    return 1;
  }
  void Reset() { pos_ = len_ = 0; }
  // Adds bytes received elsewhere (read with the hello) after the unread ones.
  void Append(std::string_view bytes) {
    if (bytes.empty()) return;
    Make(len_ - pos_ + bytes.size());
    memcpy(data_.get() + len_, bytes.data(), bytes.size());
    len_ += bytes.size();
  }
  // One read of what is there: blocks while there is nothing if `wait`, else fails with EAGAIN.
  // Bytes read, 0 at end of stream, -1 on error (errno).
  ssize_t Fill(int fd, bool wait = true) {
    if (pos_ == len_) pos_ = len_ = 0;
    if (cap_ - len_ < 1024) Make(len_ - pos_ + kChunk);
    while (true) {
      ssize_t k = recv(fd, data_.get() + len_, cap_ - len_, wait ? 0 : MSG_DONTWAIT);
      if (k < 0 && errno == EINTR) continue;
      if (k > 0) len_ += static_cast<size_t>(k);
      return k;
    }
  }

 private:
  static constexpr size_t kChunk = 4 << 10;
  // Moves the unread bytes to the front and makes room for `n` bytes from there on.
  void Make(size_t n) {
    if (pos_ > 0) {
      memmove(data_.get(), data_.get() + pos_, len_ - pos_);
      len_ -= pos_;
      pos_ = 0;
    }
    if (cap_ < n) {
      size_t cap = std::max(cap_ * 2, n);
      std::unique_ptr<char[]> d(new char[cap]);
      if (len_ > 0) memcpy(d.get(), data_.get(), len_);
      data_ = std::move(d);
      cap_ = cap;
    }
  }
  std::unique_ptr<char[]> data_;
  size_t cap_ = 0, len_ = 0, pos_ = 0;
};

namespace {
using Clock = std::chrono::steady_clock;

// Splits "host:port" / "[v6]:port".
bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return !host->empty() && !port->empty();
}

int64_t MsLeft(Clock::time_point deadline) {
  return std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
}

// Writes all of header + text + payload. False on any error (the connection is unusable).
bool SendFrame(int fd, LaneKind kind, uint16_t code, std::string_view text, std::string_view payload) {
  LaneHeader h{kLaneMagic, kind, 0, code, static_cast<uint32_t>(text.size()),
               static_cast<uint32_t>(payload.size())};
  iovec iov[3] = {{&h, sizeof h},
                  {const_cast<char*>(text.data()), text.size()},
                  {const_cast<char*>(payload.data()), payload.size()}};
  int first = 0;
  while (first < 3) {
    msghdr m{};
    m.msg_iov = iov + first;
    m.msg_iovlen = 3 - first;
    ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    while (first < 3 && static_cast<size_t>(n) >= iov[first].iov_len) {
      n -= static_cast<ssize_t>(iov[first].iov_len);
      ++first;
    }
    if (first < 3) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + n;
      iov[first].iov_len -= static_cast<size_t>(n);
    }
  }
  return true;
}

// Reads exactly n bytes. With a deadline, waits in poll() first. 1 = done, 0 = the peer closed
// before the first byte, -1 = error or closed midway, -2 = deadline passed.
int ReadFull(int fd, void* buf, size_t n, const Clock::time_point* deadline) {
  size_t got = 0;
  while (got < n) {
    if (deadline) {
      pollfd p{fd, POLLIN, 0};
      int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(MsLeft(*deadline), 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return -2;
      if (r < 0) return -1;
    }
    ssize_t k = read(fd, static_cast<char*>(buf) + got, n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -2;  // SO_RCVTIMEO
    if (k == 0) return got == 0 ? 0 : -1;
    if (k < 0) return -1;
    got += static_cast<size_t>(k);
  }
  return 1;
}

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return std::string(host) + ":" + port;
}

// ------------------------------------------------------------------------------------- client

struct PeerLane {
  int port = 0;                  // 0: no lane known
  std::string unix_name;         // tried first when set; cleared when it cannot be reached
  Clock::time_point retry_at{};  // when port == 0: ask Lane.Where again after this
};

std::mutex g_mu;
// Leaked on purpose, like the gRPC channel cache: used from threads that may outlive statics.
auto* g_lanes = new std::unordered_map<std::string, PeerLane>();          // gRPC address -> lane
auto* g_idle = new std::unordered_map<std::string, std::vector<int>>();  // address+token -> fds
constexpr size_t kMaxIdlePerPeer = 16;

std::string PoolKey(const std::string& address, const std::string& token) {
  return address + '\n' + token;
}

void ForgetLane(const std::string& address) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_lanes->erase(address);
}

void AvoidLane(const std::string& address, std::chrono::seconds how_long) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& p = (*g_lanes)[address];
  p.port = 0;
  p.unix_name.clear();
  p.retry_at = Clock::now() + how_long;
}

// Connects to the lane of `address` and says hello. Returns the fd, or -1 with *st set when the
// lane refused the token (delivered: the caller reports it) or left *st OK when it is unreachable.
int Hello(int fd, const std::string& token, Clock::time_point deadline, grpc::Status* st);

// Sends a frame that the server answers with a payload-less reply (a hello, a stream open) and
// reads that reply into *answer. False if the connection failed or the reply is malformed.
bool Ask(int fd, LaneKind kind, std::string_view text, Clock::time_point deadline, grpc::Status* answer) {
  LaneHeader h{};
  if (!SendFrame(fd, kind, 0, text, {}) || ReadFull(fd, &h, sizeof h, &deadline) != 1 ||
      h.magic != kLaneMagic || h.kind != kLaneReply || h.text_len > kLaneMaxText || h.payload_len != 0) {
    return false;
  }
  std::string msg(h.text_len, '\0');
  if (h.text_len > 0 && ReadFull(fd, msg.data(), msg.size(), &deadline) != 1) return false;
  *answer = h.code == 0 ? grpc::Status::OK : grpc::Status(static_cast<grpc::StatusCode>(h.code), msg);
  return true;
}

// An abstract Unix socket: reachable only on this host, in this network namespace.
int DialUnix(const std::string& name) {
  sockaddr_un a{};
  if (name.empty() || name.size() + 1 > sizeof a.sun_path) return -1;
  a.sun_family = AF_UNIX;
  memcpy(a.sun_path + 1, name.data(), name.size());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a),
              static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int Dial(const std::string& address, int lane_port, const std::string& unix_name, const std::string& token,
         Clock::time_point deadline, grpc::Status* st) {
  if (int fd = DialUnix(unix_name); fd >= 0) {
    grpc::Status refused;
    fd = Hello(fd, token, deadline, &refused);
    if (fd >= 0 || !refused.ok()) {
      *st = refused;
      return fd;
    }
  }
  if (!unix_name.empty()) {
    std::lock_guard<std::mutex> lock(g_mu);  // another host or namespace: TCP from now on
    auto it = g_lanes->find(address);
    if (it != g_lanes->end()) it->second.unix_name.clear();
  }
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) return -1;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(lane_port).c_str(), &hints, &res) != 0 || !res) return -1;
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      if (poll(&p, 1, static_cast<int>(MsLeft(deadline))) == 1 &&
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        rc = 0;
      }
    }
    if (rc != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return -1;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return Hello(fd, token, deadline, st);
}

// Says hello on a fresh connection; returns fd, or -1 (closed) with *st set if the token was refused.
int Hello(int fd, const std::string& token, Clock::time_point deadline, grpc::Status* st) {
  grpc::Status answer;
  if (!Ask(fd, kLaneHello, token, deadline, &answer) || !answer.ok()) {
    *st = answer;
    close(fd);
    return -1;
  }
  return fd;
}

// The lane known at this gRPC address: false if none.
bool KnownLane(const std::string& address, int* port, std::string* unix_name) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_lanes->find(address);
  if (it == g_lanes->end() || it->second.port <= 0) return false;
  *port = it->second.port;
  *unix_name = it->second.unix_name;
  return true;
}

// One protobuf message as a `msg` frame (both ends of a stream); `mu` serialises writers.
bool SendMessage(int fd, std::mutex& mu, std::string& buf, const google::protobuf::MessageLite& m) {
  std::lock_guard<std::mutex> lock(mu);
  buf.clear();
  if (!m.AppendToString(&buf)) return false;
  return SendFrame(fd, kLaneMsg, 0, {}, buf);
}
}  // namespace

void NoteLane(const std::string& address, int port, const std::string& unix_name) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (port <= 0) {
    // No entry for peers without a lane: the head of a 10,000-node cluster keeps nothing extra
    // per such node (the first call to one asks Lane.Where once).
    g_lanes->erase(address);
    return;
  }
  auto& p = (*g_lanes)[address];
  p.port = std::max(0, port);
  p.unix_name = unix_name;
}

bool HasLane(const std::string& address, const std::string& token) {
  // TORUS_LANE=0: gRPC only (a switch for comparisons and for ruling the lane out).
  static const bool disabled = [] {
    const char* v = getenv("TORUS_LANE");
    return v && std::string(v) == "0";
  }();
  if (disabled) return false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_lanes->find(address);
    if (it != g_lanes->end() && (it->second.port > 0 || Clock::now() < it->second.retry_at)) {
      return it->second.port > 0;
    }
  }
  rpc::Lane::Stub stub(GetChannel(address));
  auto ctx = NewContext(token, 2000);
  rpc::LaneWhereReply reply;
  grpc::Status st = stub.Where(ctx.get(), rpc::Empty(), &reply);
  PeerLane p;
  if (st.ok() && reply.port() > 0) {
    p.port = reply.port();
    p.unix_name = reply.unix_name();
  } else {
    // No lane there (an older or simulated peer), or unreachable now: gRPC for a while.
    p.retry_at = Clock::now() + std::chrono::seconds(st.ok() || st.error_code() == grpc::StatusCode::UNIMPLEMENTED ? 60 : 2);
  }
  std::lock_guard<std::mutex> lock(g_mu);
  (*g_lanes)[address] = p;
  return p.port > 0;
}

std::vector<LaneResult> LaneCallMany(const std::string& token, const std::vector<LaneRequest>& reqs,
                                     int64_t deadline_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(deadline_ms > 0 ? deadline_ms : 1ll << 40);
  std::vector<LaneResult> out(reqs.size());
  std::vector<int> fds(reqs.size(), -1);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto& r = reqs[i];
    int lane_port = 0;
    std::string unix_name;
    if (!KnownLane(r.address, &lane_port, &unix_name)) continue;  // not delivered: gRPC
    const std::string key = PoolKey(r.address, token);
    // A pooled connection first; a send on it can fail if the server went away meanwhile
    // (nothing was delivered then), so fall back to a fresh connection once.
    for (int attempt = 0; attempt < 2 && fds[i] < 0; ++attempt) {
      int fd = -1;
      if (attempt == 0) {
        std::lock_guard<std::mutex> lock(g_mu);
        auto& idle = (*g_idle)[key];
        if (!idle.empty()) {
          fd = idle.back();
          idle.pop_back();
        }
      }
      if (fd < 0) {
        grpc::Status refused;
        fd = Dial(r.address, lane_port, unix_name, token, deadline, &refused);
        if (fd < 0) {
          if (refused.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
            out[i].status = refused;  // as gRPC would answer: the caller reports it
            out[i].delivered = true;
          } else if (!refused.ok()) {
            AvoidLane(r.address, std::chrono::seconds(60));  // full: gRPC for a while
          } else {
            ForgetLane(r.address);  // moved or gone: ask again next time
          }
          break;
        }
      }
      if (SendFrame(fd, kLaneCall, 0, r.method, r.payload)) {
        fds[i] = fd;
      } else {
        close(fd);
      }
    }
  }
  // Replies in whatever order they come: poll every connection still owed one.
  // Kept per thread: a fresh 4 KiB buffer per peer per call cost page faults in the head.
  thread_local std::vector<LaneInbox> inbox;
  if (inbox.size() < reqs.size()) inbox.resize(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) inbox[i].Reset();
  std::vector<size_t> owed;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (fds[i] >= 0) {
      owed.push_back(i);
      out[i].delivered = true;
    }
  }
  auto fail = [&](size_t i, grpc::StatusCode code, const char* what) {
    close(fds[i]);
    fds[i] = -1;
    out[i].status = grpc::Status(code, reqs[i].method + " on " + reqs[i].address + ": " + what);
  };
  // One connection at a time: a reply that has arrived is read at once, else we wait on that
  // connection alone. (Polling all of them each round cost O(N^2) fd checks when 64 replies
  // came in one by one.) Last sent first: when that reply is in, the others mostly are too, so
  // this thread sleeps about once per batch instead of once per peer, and does not take a core
  // from the peers still working (on this 2-core machine, 64 node processes).
  for (auto oi = owed.rbegin(); oi != owed.rend(); ++oi) {
    size_t i = *oi;
    int fd = fds[i];
    LaneHeader h{};
    std::string_view text, payload;
    std::string why;
    int got;
    bool lost = false, late = false;
    while ((got = inbox[i].Next(1u << kLaneReply, &h, &text, &payload, &why)) == 0) {
      ssize_t k = inbox[i].Fill(fd, /*wait=*/false);
      if (k > 0) continue;
      if (k == 0 || errno != EAGAIN) {
        lost = true;
        break;
      }
      pollfd p{fd, POLLIN, 0};
      int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(MsLeft(deadline), 1 << 30)));
      if (r == 0) {
        late = true;
        break;
      }
      if (r < 0 && errno != EINTR) {
        lost = true;
        break;
      }
    }
    if (late) {
      fail(i, grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
      continue;
    }
    if (lost || got < 0) {
      fail(i, grpc::StatusCode::UNAVAILABLE, lost ? "connection lost" : "garbled reply");
      continue;
    }
    out[i].status = h.code == 0 ? grpc::Status::OK
                                : grpc::Status(static_cast<grpc::StatusCode>(h.code), std::string(text));
    out[i].reply.assign(payload);
    std::lock_guard<std::mutex> lock(g_mu);
    auto& idle = (*g_idle)[PoolKey(reqs[i].address, token)];
    if (idle.size() < kMaxIdlePerPeer) {
      idle.push_back(fd);
    } else {
      close(fd);
    }
    fds[i] = -1;
  }
  return out;
}

// ------------------------------------------------------------------------------------- server

LaneServer::LaneServer(std::string token, std::string what) : token_(std::move(token)), what_(std::move(what)) {}

LaneServer::~LaneServer() {
  Stop();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return threads_ == 0; });
  lock.unlock();
  JoinFinished();
}

int LaneServer::Start(const std::string& bind_host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string host = bind_host;
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &res) != 0 || !res) return 0;
  for (addrinfo* ai = res; ai && listen_fd_ < 0; ai = ai->ai_next) {
    // Non-blocking: the acceptor takes every waiting connection, then polls again. No
    // SO_REUSEPORT: the (ephemeral) port is never shared with another process.
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    // The backlog is the kernel's most (net.core.somaxconn): a burst of connections from many
    // hosts waits in the queue instead of having its SYNs dropped and retried seconds later.
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      listen_fd_ = fd;
    } else {
      close(fd);
    }
  }
  freeaddrinfo(res);
  if (listen_fd_ < 0) return 0;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  // The same service on an abstract Unix socket, for clients on this host.
  char rnd[9];
  snprintf(rnd, sizeof rnd, "%08x", static_cast<unsigned>(std::random_device{}()));
  std::string name = "torus-lane-" + std::to_string(getpid()) + "-" + rnd + std::to_string(port_);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  memcpy(a.sun_path + 1, name.data(), name.size());
  int ufd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (ufd >= 0 && bind(ufd, reinterpret_cast<sockaddr*>(&a),
                       static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())) == 0 &&
      listen(ufd, SOMAXCONN) == 0) {
    unix_fd_ = ufd;
    unix_name_ = name;
  } else if (ufd >= 0) {
    close(ufd);
  }
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return port_;
}

bool LaneServer::Stop(std::chrono::milliseconds max_wait) {
  if (stopping_.exchange(true)) {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_ == 0;
  }
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof one) < 0) {
    }
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  for (int* fd : {&listen_fd_, &unix_fd_, &wake_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  std::unique_lock<std::mutex> lock(mu_);
  for (int fd : conns_) shutdown(fd, SHUT_RDWR);
  // Handlers in progress finish first (the services they call outlive this).
  auto until = max_wait == std::chrono::milliseconds::max() ? Clock::time_point::max() : Clock::now() + max_wait;
  while (threads_ > 0) {
    auto step = std::min(until, Clock::now() + std::chrono::seconds(5));
    if (!cv_.wait_until(lock, step, [this] { return threads_ == 0; })) {
      if (Clock::now() >= until) return false;
      TORUS_LOG(WARNING) << what_ << " lane: still waiting for " << threads_ << " call(s) to finish";
    }
  }
  lock.unlock();
  JoinFinished();
  return true;
}

grpc::Status LaneServer::Where(grpc::ServerContext* ctx, const rpc::Empty*, rpc::LaneWhereReply* reply) {
  if (auto s = CheckToken(ctx, token_); !s.ok()) return s;
  reply->set_port(port_);
  reply->set_unix_name(unix_name_);
  return grpc::Status::OK;
}

struct LaneServer::PendingHello {
  int fd;
  Clock::time_point deadline;
  std::string bytes;  // received so far
};

void LaneServer::AcceptLoop() {
  std::deque<PendingHello> pending;  // oldest first, so also by deadline
  std::vector<pollfd> pf;
  while (!stopping_) {
    pf.assign({{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}, {unix_fd_, POLLIN, 0}});
    for (const auto& p : pending) pf.push_back({p.fd, POLLIN, 0});
    int timeout = pending.empty() ? 10000 : static_cast<int>(MsLeft(pending.front().deadline)) + 1;
    if (poll(pf.data(), pf.size(), timeout) < 0 && errno != EINTR) break;
    if (stopping_) break;
    JoinFinished();
    std::deque<PendingHello> still;
    auto now = Clock::now();
    for (size_t i = 0; i < pending.size(); ++i) {
      PendingHello& p = pending[i];
      if (pf[3 + i].revents != 0 && !ReadHello(p)) continue;
      if (now >= p.deadline) {
        close(p.fd);
        ++hello_late_;
        continue;
      }
      still.push_back(std::move(p));
    }
    pending.swap(still);
    if (pf[1].revents != 0) AcceptNew(listen_fd_, true, &pending);
    if (pf[2].revents != 0) AcceptNew(unix_fd_, false, &pending);
    LogRefusals(false);
  }
  for (auto& p : pending) close(p.fd);
  LogRefusals(true);
}

void LaneServer::AcceptNew(int listen_fd, bool tcp, std::deque<PendingHello>* pending) {
  for (int n = 0; n < 256 && !stopping_; ++n) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return;  // EAGAIN: none left
    }
    if (pending->size() >= kLaneMaxPending) {
      close(pending->front().fd);  // the oldest silent connection makes room
      pending->pop_front();
      ++hello_dropped_;
    }
    int one = 1;
    if (tcp) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pending->push_back({fd, Clock::now() + std::chrono::milliseconds(kLaneHelloTimeoutMs), {}});
  }
}

bool LaneServer::ReadHello(PendingHello& p) {
  LaneHeader h{};
  while (true) {
    size_t want = sizeof h;
    if (p.bytes.size() >= sizeof h) {
      memcpy(&h, p.bytes.data(), sizeof h);
      if (h.magic != kLaneMagic || h.kind != kLaneHello || h.text_len > 4096 || h.payload_len != 0) {
        ++hello_garbled_;  // not a lane client: closed without an answer
        close(p.fd);
        return false;
      }
      want += h.text_len;
      if (p.bytes.size() >= want) break;
    }
    char buf[4096 + sizeof h];
    ssize_t k = recv(p.fd, buf, std::min(sizeof buf, want - p.bytes.size()), 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (k <= 0) {
      close(p.fd);
      return false;
    }
    p.bytes.append(buf, static_cast<size_t>(k));
  }
  std::string_view token(p.bytes.data() + sizeof h, h.text_len);
  if (!TokenEquals(token, token_)) {
    fcntl(p.fd, F_SETFL, fcntl(p.fd, F_GETFL) & ~O_NONBLOCK);
    SendFrame(p.fd, kLaneReply, static_cast<uint16_t>(grpc::StatusCode::UNAUTHENTICATED),
              token.empty() ? "missing cluster token" : "wrong cluster token", {});
    close(p.fd);
    return false;
  }
  Admit(p.fd, p.bytes.substr(sizeof h + h.text_len));
  return false;
}

void LaneServer::Admit(int fd, std::string early) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // connection threads block
  std::lock_guard<std::mutex> lock(mu_);
  if (conns_.size() >= kLaneMaxConnections) {
    // Said, not just closed: the client then uses gRPC with this server for a while.
    if (!full_logged_) TORUS_LOG(WARNING) << what_ << " lane: " << kLaneMaxConnections
                                          << " connections open; further clients are sent to gRPC";
    full_logged_ = true;
    SendFrame(fd, kLaneReply, static_cast<uint16_t>(grpc::StatusCode::RESOURCE_EXHAUSTED), "the lane is full", {});
    close(fd);
    return;
  }
  if (!SendFrame(fd, kLaneReply, 0, {}, {})) {
    close(fd);
    return;
  }
  conns_.insert(fd);
  ++threads_;
  uint64_t id = next_conn_id_++;
  serving_.emplace(id, std::thread([this, fd, id, early = std::move(early)]() mutable {
    Serve(fd, std::move(early), id);
  }));
}

void LaneServer::JoinFinished() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t id : finished_) {
      auto it = serving_.find(id);
      if (it == serving_.end()) continue;
      done.push_back(std::move(it->second));
      serving_.erase(it);
    }
    finished_.clear();
  }
  for (auto& t : done) t.join();  // each has left Serve: only its return is left
}

void LaneServer::LogRefusals(bool force) {
  auto now = Clock::now();
  if (hello_late_ + hello_dropped_ + hello_garbled_ == 0) return;
  if (!force && now - refusals_logged_ < std::chrono::seconds(10)) return;
  TORUS_LOG(WARNING) << what_ << " lane: closed unauthenticated connections: " << hello_late_
                     << " without a hello within " << kLaneHelloTimeoutMs << " ms, " << hello_dropped_
                     << " dropped (more than " << kLaneMaxPending << " waiting for their hello), "
                     << hello_garbled_ << " whose first frame was not a lane hello";
  hello_late_ = hello_dropped_ = hello_garbled_ = 0;
  refusals_logged_ = now;
}

void LaneServer::Serve(int fd, std::string early, uint64_t id) {
  auto garbled = [&](const std::string& why) {
    TORUS_LOG(WARNING) << what_ << " lane: closing the connection from " << PeerName(fd) << ": " << why;
  };
  LaneHeader h{};
  LaneInbox in;
  in.Append(early);
  std::string out;
  while (!stopping_) {
    std::string_view method, payload;
    std::string why;
    int got = in.Next((1u << kLaneCall) | (1u << kLaneOpen), &h, &method, &payload, &why);
    if (got < 0) {
      garbled(why);
      break;
    }
    if (got == 0) {
      // Wait in poll(POLLIN), not in a blocking recv: a thread asleep in recv on a Unix stream
      // socket is also woken each time the peer reads what this side sent (the write-space
      // wake-up is not filtered by event), i.e. once more per call for nothing.
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, -1) < 0 && errno != EINTR) {
        garbled(std::string("poll failed: ") + strerror(errno));
        break;
      }
      ssize_t k = in.Fill(fd, /*wait=*/false);
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (k == 0) break;  // closed by the client (or by Stop)
      if (k < 0) {
        garbled(std::string("read failed: ") + strerror(errno));
        break;
      }
      continue;
    }
    if (h.kind == kLaneOpen) {
      // The connection becomes this one stream: acknowledge, serve, answer the status, close.
      auto sit = streams_.find(std::string(method));
      if (sit == streams_.end()) {
        SendFrame(fd, kLaneReply, static_cast<uint16_t>(grpc::StatusCode::UNIMPLEMENTED),
                  "the " + what_ + " lane has no stream '" + std::string(method.substr(0, 200)) + "'", {});
        continue;
      }
      if (!SendFrame(fd, kLaneReply, 0, {}, {})) break;
      LaneServerStream stream(fd, &in);
      grpc::Status st = sit->second(&stream);
      SendFrame(fd, kLaneReply, static_cast<uint16_t>(st.error_code()), st.error_message(), {});
      break;
    }
    out.clear();
    grpc::Status st;
    const Handler* handler = nullptr;
    for (const auto& [m, f] : handlers_) {
      if (m == method) {
        handler = &f;
        break;
      }
    }
    if (!handler) {
      st = grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "the " + what_ + " lane has no method '" +
                                                             std::string(method.substr(0, 200)) + "'");
    } else {
      st = (*handler)(payload, &out);
    }
    if (!SendFrame(fd, kLaneReply, static_cast<uint16_t>(st.error_code()), st.error_message(),
                   st.ok() ? std::string_view(out) : std::string_view())) {
      break;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  conns_.erase(fd);
  close(fd);
  --threads_;
  finished_.push_back(id);
  cv_.notify_all();
}

// ------------------------------------------------------------------------------------- streams

bool LaneServerStream::Read(google::protobuf::MessageLite* m) {
  while (!done_) {
    LaneHeader h{};
    std::string_view text, payload;
    std::string why;
    int got = in_->Next((1u << kLaneMsg) | (1u << kLaneEnd), &h, &text, &payload, &why);
    if (got < 0) break;
    if (got == 0) {
      if (in_->Fill(fd_) <= 0) break;
      continue;
    }
    if (h.kind == kLaneEnd) break;
    if (m->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) return true;
    break;
  }
  done_ = true;
  return false;
}

bool LaneServerStream::Write(const google::protobuf::MessageLite& m) {
  return SendMessage(fd_, write_mu_, buf_, m);
}

LaneClientStream::LaneClientStream(int fd, std::string what)
    : fd_(fd), what_(std::move(what)), in_(std::make_unique<LaneInbox>()) {}

LaneClientStream::~LaneClientStream() {
  if (fd_ >= 0) close(fd_);
}

std::unique_ptr<LaneClientStream> LaneClientStream::Open(const std::string& address, const std::string& token,
                                                         const std::string& method) {
  if (InProcessServiceAt(address) || !HasLane(address, token)) return nullptr;
  int lane_port = 0;
  std::string unix_name;
  if (!KnownLane(address, &lane_port, &unix_name)) return nullptr;
  auto deadline = Clock::now() + std::chrono::seconds(5);
  grpc::Status refused;
  int fd = Dial(address, lane_port, unix_name, token, deadline, &refused);
  if (fd < 0) return nullptr;
  grpc::Status answer;
  if (!Ask(fd, kLaneOpen, method, deadline, &answer) || !answer.ok()) {
    close(fd);
    return nullptr;  // no such stream there: gRPC
  }
  return std::make_unique<LaneClientStream>(fd, method + " on " + address);
}

bool LaneClientStream::Write(const google::protobuf::MessageLite& m) {
  return SendMessage(fd_, write_mu_, buf_, m);
}

void LaneClientStream::WritesDone() {
  std::lock_guard<std::mutex> lock(write_mu_);
  SendFrame(fd_, kLaneEnd, 0, {}, {});
}

bool LaneClientStream::Read(google::protobuf::MessageLite* m) {
  while (!have_final_) {
    LaneHeader h{};
    std::string_view text, payload;
    std::string why;
    int got = in_->Next((1u << kLaneMsg) | (1u << kLaneReply), &h, &text, &payload, &why);
    if (got < 0) {
      final_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, what_ + ": garbled frame (" + why + ")");
      have_final_ = true;
      break;
    }
    if (got == 0) {
      if (in_->Fill(fd_) <= 0) {
        final_ = cancelled_ ? grpc::Status(grpc::StatusCode::CANCELLED, what_ + ": cancelled")
                            : grpc::Status(grpc::StatusCode::UNAVAILABLE, what_ + ": connection lost");
        have_final_ = true;
      }
      continue;
    }
    if (h.kind == kLaneReply) {
      final_ = h.code == 0 ? grpc::Status::OK
                           : grpc::Status(static_cast<grpc::StatusCode>(h.code), std::string(text));
      have_final_ = true;
      break;
    }
    if (m->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) return true;
    final_ = grpc::Status(grpc::StatusCode::INTERNAL, what_ + ": unparsable message");
    have_final_ = true;
  }
  return false;
}

grpc::Status LaneClientStream::Finish() {
  return have_final_ ? final_ : grpc::Status(grpc::StatusCode::UNKNOWN, what_ + ": not finished");
}

void LaneClientStream::Cancel() {
  cancelled_ = true;
  shutdown(fd_, SHUT_RDWR);
}

}  // namespace torus
