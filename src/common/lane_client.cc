// The client's end of the lane (lane.h): which gRPC peers have a lane and where, pooled
// connections to them, unary calls in batches (LaneCallMany) and client streams.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>

// First: its macros must be defined before gRPC's absl defines the same names (absl's
// redefinition, in a system header, is then not warned about).
#include "common/thread_annotations.h"
// Then the lane, which includes gRPC.
#include "common/lane.h"
#include "common/lane_frame.h"

namespace torus {
namespace {

using lane_internal::Clock;
using lane_internal::MsLeft;
using lane_internal::ReadFull;
using lane_internal::SendFrame;
using lane_internal::SendMessage;
using lane_internal::SplitHostPort;

struct PeerLane {
  int port = 0;                  // 0: no lane known
  std::string unix_name;         // tried first when set; cleared when it cannot be reached
  Clock::time_point retry_at{};  // when port == 0: ask Lane.Where again after this
};

constexpr size_t kMaxIdlePerPeer = 16;

// The lanes of the gRPC peers this process calls (by gRPC address) and the idle, authenticated
// connections to them (by address and token). Any thread; `mu_` guards both maps and is never
// held across I/O.
class LaneDirectory {
 public:
  // Leaked on purpose, like the gRPC channel cache: used from threads that may outlive statics.
  static LaneDirectory& Get() {
    static auto* d = new LaneDirectory;
    return *d;
  }

  void Forget(const std::string& address) EXCLUDES(mu_) {
    MutexLock l(mu_);
    lanes_.erase(address);
  }
  // No lane at `address` for `how_long`: gRPC meanwhile.
  void Avoid(const std::string& address, std::chrono::seconds how_long) EXCLUDES(mu_) {
    MutexLock l(mu_);
    auto& p = lanes_[address];
    p.port = 0;
    p.unix_name.clear();
    p.retry_at = Clock::now() + how_long;
  }
  void ClearUnix(const std::string& address) EXCLUDES(mu_) {
    MutexLock l(mu_);
    auto it = lanes_.find(address);
    if (it != lanes_.end()) it->second.unix_name.clear();
  }
  // The lane known at this gRPC address: false if none.
  bool Known(const std::string& address, int* port, std::string* unix_name) EXCLUDES(mu_) {
    MutexLock l(mu_);
    auto it = lanes_.find(address);
    if (it == lanes_.end() || it->second.port <= 0) return false;
    *port = it->second.port;
    *unix_name = it->second.unix_name;
    return true;
  }
  // True with *has set when the entry of `address` answers HasLane without asking the peer
  // (a lane is known, or the last answer was "none" and not yet stale).
  bool Settled(const std::string& address, bool* has) EXCLUDES(mu_) {
    MutexLock l(mu_);
    auto it = lanes_.find(address);
    if (it == lanes_.end() || (it->second.port <= 0 && Clock::now() >= it->second.retry_at)) return false;
    *has = it->second.port > 0;
    return true;
  }
  void Set(const std::string& address, PeerLane p) EXCLUDES(mu_) {
    MutexLock l(mu_);
    lanes_[address] = std::move(p);
  }

  // An idle connection for `key` (PoolKey), or -1.
  int TakeIdle(const std::string& key) EXCLUDES(mu_) {
    MutexLock l(mu_);
    auto& idle = idle_[key];
    if (idle.empty()) return -1;
    int fd = idle.back();
    idle.pop_back();
    return fd;
  }
  // Keeps `fd` for the next call to its peer, or closes it when kMaxIdlePerPeer are kept.
  void PutIdle(const std::string& key, int fd) EXCLUDES(mu_) {
    MutexLock l(mu_);
    auto& idle = idle_[key];
    if (idle.size() < kMaxIdlePerPeer) {
      idle.push_back(fd);
    } else {
      close(fd);
    }
  }

 private:
  Mutex mu_;
  std::unordered_map<std::string, PeerLane> lanes_ GUARDED_BY(mu_);          // gRPC address -> lane
  std::unordered_map<std::string, std::vector<int>> idle_ GUARDED_BY(mu_);  // address+token -> fds
};

std::string PoolKey(const std::string& address, const std::string& token) {
  return address + '\n' + token;
}

// Says hello on a fresh connection to the lane of gRPC address `address` (the token, and the
// gRPC port meant). Returns the fd, or -1 (closed) with *st set when the lane refused (the token;
// FAILED_PRECONDITION: it belongs to another gRPC server), OK when it is unreachable.
int Hello(int fd, const std::string& token, const std::string& address, Clock::time_point deadline,
          grpc::Status* st);

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
    fd = Hello(fd, token, address, deadline, &refused);
    if (fd >= 0 || !refused.ok()) {
      *st = refused;
      return fd;
    }
  }
  if (!unix_name.empty()) LaneDirectory::Get().ClearUnix(address);  // another host or namespace: TCP from now on
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
  return Hello(fd, token, address, deadline, st);
}

int Hello(int fd, const std::string& token, const std::string& address, Clock::time_point deadline,
          grpc::Status* st) {
  std::string host, port, hello = token;
  if (SplitHostPort(address, &host, &port)) hello += "\n" + port;
  grpc::Status answer;
  if (!Ask(fd, kLaneHello, hello, deadline, &answer) || !answer.ok()) {
    *st = answer;
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `r` on a pooled connection, else a fresh one. A send on a pooled connection can fail if
// the server went away meanwhile (nothing was delivered then), so a fresh connection is tried
// once. Returns the fd owed a reply, or -1: not delivered (the caller may use gRPC), or
// delivered and refused when *out says so (the token).
int SendCall(const std::string& token, const LaneRequest& r, Clock::time_point deadline, LaneResult* out) {
  int lane_port = 0;
  std::string unix_name;
  if (!LaneDirectory::Get().Known(r.address, &lane_port, &unix_name)) return -1;  // not delivered: gRPC
  const std::string key = PoolKey(r.address, token);
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = attempt == 0 ? LaneDirectory::Get().TakeIdle(key) : -1;
    if (fd < 0) {
      grpc::Status refused;
      fd = Dial(r.address, lane_port, unix_name, token, deadline, &refused);
      if (fd < 0) {
        if (refused.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
          out->status = refused;  // as gRPC would answer: the caller reports it
          out->delivered = true;
        } else if (refused.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
          // Another process's lane now has that port: ask the gRPC server where its lane is.
          LaneDirectory::Get().Forget(r.address);
        } else if (!refused.ok()) {
          LaneDirectory::Get().Avoid(r.address, std::chrono::seconds(60));  // full: gRPC for a while
        } else {
          LaneDirectory::Get().Forget(r.address);  // moved or gone: ask again next time
        }
        return -1;
      }
    }
    if (SendFrame(fd, kLaneCall, 0, r.method, r.payload)) return fd;
    close(fd);
  }
  return -1;
}

// Reads the reply owed on `fd` into *out. A reply that has arrived is read at once, else this
// waits on that connection alone. False, with out->status saying why, when the connection is
// lost, garbled or late: the caller closes it.
bool ReadReply(int fd, LaneInbox& inbox, const LaneRequest& r, Clock::time_point deadline, LaneResult* out) {
  LaneHeader h{};
  std::string_view text, payload;
  std::string why;
  int got;
  bool lost = false, late = false;
  while ((got = inbox.Next(1u << kLaneReply, &h, &text, &payload, &why)) == 0) {
    ssize_t k = inbox.Fill(fd, /*wait=*/false);
    if (k > 0) continue;
    if (k == 0 || errno != EAGAIN) {
      lost = true;
      break;
    }
    pollfd p{fd, POLLIN, 0};
    int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(MsLeft(deadline), 1 << 30)));
    if (n == 0) {
      late = true;
      break;
    }
    if (n < 0 && errno != EINTR) {
      lost = true;
      break;
    }
  }
  if (late || lost || got < 0) {
    grpc::StatusCode code = late ? grpc::StatusCode::DEADLINE_EXCEEDED : grpc::StatusCode::UNAVAILABLE;
    const char* what = late ? "deadline exceeded" : lost ? "connection lost" : "garbled reply";
    out->status = grpc::Status(code, r.method + " on " + r.address + ": " + what);
    return false;
  }
  out->status = h.code == 0 ? grpc::Status::OK : grpc::Status(static_cast<grpc::StatusCode>(h.code), std::string(text));
  out->reply.assign(payload);
  return true;
}

}  // namespace

void NoteLane(const std::string& address, int port, const std::string& unix_name) {
  if (port <= 0) {
    // No entry for peers without a lane: the head of a 10,000-node cluster keeps nothing extra
    // per such node (the first call to one asks Lane.Where once).
    LaneDirectory::Get().Forget(address);
    return;
  }
  PeerLane p;
  p.port = port;
  p.unix_name = unix_name;
  LaneDirectory::Get().Set(address, std::move(p));
}

bool HasLane(const std::string& address, const std::string& token) {
  // TORUS_LANE=0: gRPC only (a switch for comparisons and for ruling the lane out).
  static const bool disabled = [] {
    const char* v = getenv("TORUS_LANE");
    return v && std::string(v) == "0";
  }();
  if (disabled) return false;
  if (bool has = false; LaneDirectory::Get().Settled(address, &has)) return has;
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
  const bool has = p.port > 0;
  LaneDirectory::Get().Set(address, std::move(p));
  return has;
}

std::vector<LaneResult> LaneCallMany(const std::string& token, const std::vector<LaneRequest>& reqs,
                                     int64_t deadline_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(deadline_ms > 0 ? deadline_ms : 1ll << 40);
  std::vector<LaneResult> out(reqs.size());
  std::vector<int> fds(reqs.size(), -1);
  for (size_t i = 0; i < reqs.size(); ++i) fds[i] = SendCall(token, reqs[i], deadline, &out[i]);
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
  // One connection at a time: a reply that has arrived is read at once, else we wait on that
  // connection alone. (Polling all of them each round cost O(N^2) fd checks when 64 replies
  // came in one by one.) Last sent first: when that reply is in, the others mostly are too, so
  // this thread sleeps about once per batch instead of once per peer, and does not take a core
  // from the peers still working (on this 2-core machine, 64 node processes).
  for (auto oi = owed.rbegin(); oi != owed.rend(); ++oi) {
    size_t i = *oi;
    if (ReadReply(fds[i], inbox[i], reqs[i], deadline, &out[i])) {
      LaneDirectory::Get().PutIdle(PoolKey(reqs[i].address, token), fds[i]);
    } else {
      close(fds[i]);
    }
    fds[i] = -1;
  }
  return out;
}

// ------------------------------------------------------------------------------------- streams

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
  if (!LaneDirectory::Get().Known(address, &lane_port, &unix_name)) return nullptr;
  auto deadline = Clock::now() + std::chrono::seconds(5);
  grpc::Status refused;
  int fd = Dial(address, lane_port, unix_name, token, deadline, &refused);
  if (fd < 0) {
    // Unreachable, or another process's lane now: ask where the lane is next time.
    if (refused.ok() || refused.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      LaneDirectory::Get().Forget(address);
    }
    return nullptr;
  }
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

bool LaneClientStream::Read(google::protobuf::MessageLite* m) { return ReadWithin(m, -1) > 0; }

int LaneClientStream::ReadWithin(google::protobuf::MessageLite* m, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
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
      if (timeout_ms >= 0) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        pollfd p{fd_, POLLIN, 0};
        int n = poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
        if (n == 0) return 0;
        if (n < 0 && errno == EINTR) continue;
      }
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
    if (m->ParseFromArray(payload.data(), static_cast<int>(payload.size()))) return 1;
    final_ = grpc::Status(grpc::StatusCode::INTERNAL, what_ + ": unparsable message");
    have_final_ = true;
  }
  return -1;
}

grpc::Status LaneClientStream::Finish() {
  return have_final_ ? final_ : grpc::Status(grpc::StatusCode::UNKNOWN, what_ + ": not finished");
}

void LaneClientStream::Cancel() {
  cancelled_ = true;
  shutdown(fd_, SHUT_RDWR);
}

void LaneClientStream::KeepAlive(int idle_s, int interval_s, int count) {
  int on = 1;
  if (setsockopt(fd_, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) != 0) return;  // not a socket that has it
  (void)setsockopt(fd_, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  (void)setsockopt(fd_, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  (void)setsockopt(fd_, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

}  // namespace torus
