// The server's end of the lane (lane.h): LaneServer (listening, hellos, one thread per
// authenticated connection) and LaneServerStream.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <random>

#include "common/lane.h"
#include "common/lane_frame.h"
#include "common/logging.h"
#include "common/metrics.h"

namespace torus {

using lane_internal::Clock;
using lane_internal::MsLeft;
using lane_internal::PeerName;
using lane_internal::SendFrame;
using lane_internal::SendMessage;

LaneServer::LaneServer(std::string token, std::string what) : token_(std::move(token)), what_(std::move(what)) {}

LaneServer::~LaneServer() {
  Stop();
  MutexLock lock(mu_);
  while (threads_ > 0) cv_.Wait(lock);
  lock.Unlock();
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
    MutexLock lock(mu_);
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
  MutexLock lock(mu_);
  for (int fd : conns_) shutdown(fd, SHUT_RDWR);
  // Handlers in progress finish first (the services they call outlive this).
  auto until = max_wait == std::chrono::milliseconds::max() ? Clock::time_point::max() : Clock::now() + max_wait;
  auto warn_at = Clock::now() + std::chrono::seconds(5);
  while (threads_ > 0) {
    cv_.WaitUntil(lock, std::min(until, warn_at));
    if (threads_ == 0) break;
    if (Clock::now() >= until) return false;
    if (Clock::now() >= warn_at) {
      TORUS_LOG(WARNING) << what_ << " lane: still waiting for " << threads_ << " call(s) to finish";
      warn_at = Clock::now() + std::chrono::seconds(5);
    }
  }
  lock.Unlock();
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
  // The hello: the token, then (from clients that know it) '\n' and the gRPC port they meant.
  std::string_view token(p.bytes.data() + sizeof h, h.text_len);
  std::string_view meant;
  if (auto nl = token.rfind('\n'); nl != std::string_view::npos) {
    meant = token.substr(nl + 1);
    token = token.substr(0, nl);
  }
  if (const int mine = grpc_port_.load(); mine > 0 && !meant.empty() && meant != std::to_string(mine)) {
    fcntl(p.fd, F_SETFL, fcntl(p.fd, F_GETFL) & ~O_NONBLOCK);
    SendFrame(p.fd, kLaneReply, static_cast<uint16_t>(grpc::StatusCode::FAILED_PRECONDITION),
              "this is the lane of the " + what_ + " (gRPC port " + std::to_string(mine) + "), not of gRPC port " +
                  std::string(meant.substr(0, 16)),
              {});
    close(p.fd);
    return false;
  }
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
  MutexLock lock(mu_);
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
    MutexLock lock(mu_);
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
      auto t0 = std::chrono::steady_clock::now();
      st = (*handler)(payload, &out);
      ServedCallMetrics(method)->Record(st.ok(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (!SendFrame(fd, kLaneReply, static_cast<uint16_t>(st.error_code()), st.error_message(),
                   st.ok() ? std::string_view(out) : std::string_view())) {
      break;
    }
  }
  MutexLock lock(mu_);
  conns_.erase(fd);
  close(fd);
  --threads_;
  finished_.push_back(id);
  cv_.NotifyAll();
}

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

}  // namespace torus
