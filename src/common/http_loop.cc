#include "common/http_loop.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/logging.h"

namespace torus {

namespace {

constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr size_t kReadChunk = 64 * 1024;
constexpr std::chrono::milliseconds kSweepEvery{200};

// Raises the open-file soft limit to the hard one; the soft limit after it.
rlim_t RaiseFileLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 1024;
  if (r.rlim_cur < r.rlim_max) {
    rlimit want = r;
    want.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) r = want;
  }
  return r.rlim_cur;
}

std::string PeerAddress(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, text, sizeof text);
  } else if (a.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, text, sizeof text);
  }
  return text;
}

// Extra time a transfer of `bytes` may take on top of its deadline: 1 s per 64 KiB.
std::chrono::milliseconds ForBytes(uint64_t bytes) {
  return std::chrono::milliseconds(bytes / 64);
}

}  // namespace

std::string SerializeResponse(const HttpResponse& r, bool head_only, bool keep_alive) {
  const std::string& body = r.status >= 400 && r.body.empty() ? std::string(HttpStatusText(r.status)) : r.body;
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + HttpStatusText(r.status) + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  out += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
  out += "\r\n";
  if (!head_only) out += body;
  return out;
}

HttpServer::Loop::Loop(HttpServer& server)
    : server_(server), opts_(server.opts_), pool_(std::max(1, server.opts_.threads), 0), probe_(1, 0) {
  limits_.max_body_bytes = opts_.max_body_bytes;
}

HttpServer::Loop::~Loop() {
  Stop();
  for (int fd : {listen_fd_, epoll_fd_, wake_fd_, spare_fd_}) {
    if (fd >= 0) close(fd);
  }
}

int HttpServer::Loop::Listen(int port, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string host = opts_.host.empty() ? "0.0.0.0" : opts_.host;
  std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    *error = std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
    *error = std::strerror(errno);
    freeaddrinfo(res);
    if (fd >= 0) close(fd);
    return -1;
  }
  freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  listen_fd_ = fd;
  return ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(bound).sin6_port
                                           : reinterpret_cast<sockaddr_in&>(bound).sin_port);
}

void HttpServer::Loop::Start() {
  rlim_t files = RaiseFileLimit();
  max_conns_ = static_cast<int>(std::min<rlim_t>(static_cast<rlim_t>(std::max(1, opts_.max_connections)),
                                                 std::max<rlim_t>(files / 2, 16)));
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerId;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.u64 = kWakeId;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { Run(); });
}

void HttpServer::Loop::Stop() {
  if (thread_.joinable()) {
    Wake();  // server_.stopping_ is already true
    thread_.join();
  }
  pool_.Stop();  // queued handlers still run; their answers are dropped
  probe_.Stop();
  ReapStreams(true);
}

void HttpServer::Loop::Wake() {
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
}

void HttpServer::Loop::Run() {
  std::vector<epoll_event> events(256);
  last_sweep_ = Clock::now();
  while (!server_.stopping_.load()) {
    int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()),
                       static_cast<int>(kSweepEvery.count()));
    for (int i = 0; i < n && !server_.stopping_.load(); ++i) {
      uint64_t id = events[i].data.u64;
      if (id == kListenerId) {
        Accept();
      } else if (id == kWakeId) {
        uint64_t v;
        (void)!read(wake_fd_, &v, sizeof v);
        TakeDone();
      } else {
        OnEvent(id, events[i].events);
      }
    }
    auto now = Clock::now();
    if (now - last_sweep_ >= kSweepEvery) {
      last_sweep_ = now;
      Sweep(now);
      ReapStreams(false);
    }
  }
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : conns_) ids.push_back(id);
  for (uint64_t id : ids) Close(id);
}

void HttpServer::Loop::Accept() {
  for (int i = 0; i < 256; ++i) {
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if ((errno == EMFILE || errno == ENFILE) && spare_fd_ >= 0) {
        // Out of files: take the connection with the spare descriptor and close it, so the
        // listener does not stay readable forever.
        close(spare_fd_);
        int drop = accept(listen_fd_, nullptr, nullptr);
        if (drop >= 0) close(drop);
        spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
        TORUS_LOG(WARNING) << opts_.name << ": out of file descriptors; a connection was refused";
        continue;
      }
      return;  // EAGAIN, or an error of the one connection
    }
    Admit(fd, PeerAddress(peer));
  }
}

void HttpServer::Loop::Admit(int fd, const std::string& client) {
  Client& cl = clients_[client];
  if (cl.conns >= std::max(1, opts_.max_connections_per_client) && !EvictOldest(client)) {
    close(fd);  // every connection of this client runs a request
    return;
  }
  if (static_cast<int>(conns_.size()) >= max_conns_ && !EvictOldest("")) {
    close(fd);
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto c = std::make_unique<Conn>();
  c->id = next_id_++;
  c->fd = fd;
  c->client = client;
  auto now = Clock::now();
  c->since = now;
  SetState(*c, State::kIdle, now);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = c->id;
  c->events = EPOLLIN;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  ++clients_[client].conns;
  conns_.emplace(c->id, std::move(c));
}

bool HttpServer::Loop::EvictOldest(const std::string& client) {
  Conn* oldest = nullptr;
  for (auto& [id, c] : conns_) {
    bool evictable = c->state != State::kBusy && c->state != State::kWrite;
    if (!evictable || (!client.empty() && c->client != client)) continue;
    if (!oldest || c->since < oldest->since) oldest = c.get();
  }
  if (!oldest) return false;
  Close(oldest->id);
  return true;
}

void HttpServer::Loop::OnEvent(uint64_t id, uint32_t events) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  if (events & EPOLLERR) {
    Close(id);
    return;
  }
  if ((events & EPOLLOUT) && c.state == State::kWrite) {
    Flush(c);
    return;
  }
  if (events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) Read(c);
}

void HttpServer::Loop::Read(Conn& c) {
  char buf[kReadChunk];
  bool eof = false;
  // Read at most one chunk past what the current request may still need: the rest waits in the
  // socket (back-pressure), and a flood of bytes never grows `in` past the limits.
  size_t cap = limits_.max_head_bytes + kReadChunk +
               (c.state == State::kBody && !c.head.chunked ? static_cast<size_t>(c.head.content_length) : 0);
  while (c.in.size() < cap) {
    ssize_t n = recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) eof = true;
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) eof = true;
    break;
  }
  uint64_t id = c.id;
  if (c.state == State::kLinger) {
    c.in.clear();
    if (eof) Close(id);
    return;
  }
  Advance(c);
  if (eof) {
    auto it = conns_.find(id);
    // A peer that stopped sending may still read our answer of a request it already sent.
    if (it != conns_.end() && it->second->state != State::kBusy && it->second->state != State::kWrite) Close(id);
    else if (it != conns_.end()) SetInterest(*it->second, it->second->events & ~static_cast<uint32_t>(EPOLLIN));
  }
}

void HttpServer::Loop::Advance(Conn& c) {
  auto now = Clock::now();
  for (;;) {
    if (c.state == State::kIdle) {
      if (c.in.empty()) return;
      SetState(c, State::kHead, now);
      c.scanned = 0;
    }
    if (c.state == State::kHead) {
      size_t len = 0;
      int status = 0;
      std::string why;
      c.head = HttpHead{};
      ParseResult r = ParseHttpHead(c.in, limits_, &c.head, &len, &status, &why, &c.scanned);
      if (r == ParseResult::kNeedMore) return;
      if (r == ParseResult::kError) return Refuse(c, status, why);
      c.in.erase(0, len);
      if (!OnHead(c)) return;
    }
    if (c.state != State::kBody || !ReadBody(c)) return;
  }
}

bool HttpServer::Loop::OnHead(Conn& c) {
  HttpRequest& req = c.req;
  req = HttpRequest{};
  req.method = c.head.method;
  req.path = c.head.path;
  req.query = c.head.query;
  req.headers = c.head.headers;
  req.remote = c.client;
  int status = 0;
  std::string why;
  bool ws = c.head.upgrade_websocket && req.method == "GET";
  const Route* r = server_.Match(ws ? server_.ws_routes_ : server_.routes_, req, &status);
  if (!r) {
    Refuse(c, status, status == 405 ? "method " + req.method + " is not allowed on " + req.path
                                    : std::string(ws ? "no such websocket endpoint: " : "no such endpoint: ") + req.path);
    return false;
  }
  if (int s = server_.CheckAccess(*r, req, &why); s != 0) {
    Refuse(c, s, why);
    return false;
  }
  if (ws) {
    StartStream(c, *r);
    return false;
  }
  if (!c.head.chunked && c.head.content_length > opts_.max_body_bytes) {
    Refuse(c, 413, "request body over the limit of " + std::to_string(opts_.max_body_bytes) + " bytes");
    return false;
  }
  c.route = r;
  c.keep_alive = c.head.keep_alive;
  if (c.head.chunked) c.chunked = std::make_unique<ChunkedDecoder>(opts_.max_body_bytes);
  SetState(c, State::kBody, Clock::now());
  bool complete = !c.head.chunked && c.in.size() >= c.head.content_length;
  if (c.head.expect_continue && !complete) {
    static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
    (void)!send(c.fd, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  c.req.body.clear();
  return true;
}

bool HttpServer::Loop::ReadBody(Conn& c) {
  if (c.chunked) {
    int status = 0;
    std::string why;
    ParseResult r = c.chunked->Feed(c.in, &c.req.body, &status, &why);
    if (r == ParseResult::kNeedMore) return false;
    if (r == ParseResult::kError) {
      Refuse(c, status, why);
      return false;
    }
    c.chunked.reset();
  } else {
    size_t need = static_cast<size_t>(c.head.content_length);
    if (c.in.size() < need) return false;
    c.req.body.assign(c.in, 0, need);
    c.in.erase(0, need);
  }
  Dispatch(c, *c.route);
  return false;  // busy, answered or gone
}

void HttpServer::Loop::Dispatch(Conn& c, const Route& r) {
  Client& cl = clients_[c.client];
  bool pool = r.lane == Lane::kPool;
  if (pool && (queued_ >= opts_.max_queued || cl.requests >= opts_.max_requests_per_client)) {
    HttpResponse busy = HttpResponse::Text(
        "the " + opts_.name + " is busy (" +
            (queued_ >= opts_.max_queued ? std::to_string(queued_) + " requests queued"
                                         : "this client has " + std::to_string(cl.requests) + " requests running") +
            "); try again shortly",
        503);
    busy.headers.emplace_back("Retry-After", "1");
    Respond(c, SerializeResponse(busy, c.req.method == "HEAD", c.keep_alive), c.keep_alive);
    return;
  }
  if (pool) ++queued_;
  ++cl.requests;
  SetState(c, State::kBusy, Clock::now());
  SetInterest(c, 0);
  auto job = [this, &r, id = c.id, req = std::move(c.req), keep = c.keep_alive, pool]() {
    HttpResponse resp = server_.Run(r, req);
    std::string bytes = SerializeResponse(resp, req.method == "HEAD", keep);
    {
      MutexLock lock(mu_);
      done_.push_back({id, std::move(bytes), keep, pool});
    }
    Wake();
  };
  (pool ? pool_ : probe_).Post(std::move(job));
}

void HttpServer::Loop::TakeDone() {
  std::vector<Done> done;
  {
    MutexLock lock(mu_);
    done.swap(done_);
  }
  for (auto& d : done) {
    if (d.pool) --queued_;
    auto it = conns_.find(d.conn);
    if (it == conns_.end()) continue;  // closed meanwhile (its client's count went with it)
    Conn& c = *it->second;
    --clients_[c.client].requests;
    Respond(c, std::move(d.bytes), d.keep_alive);
  }
}

void HttpServer::Loop::StartStream(Conn& c, const Route& r) {
  ReapStreams(false);
  size_t active = 0;
  {
    MutexLock lock(mu_);
    active = streams_.size();
  }
  if (static_cast<int>(active) >= opts_.max_streams) {
    Refuse(c, 503, "too many websocket streams are open (" + std::to_string(active) + "); try again later");
    return;
  }
  int fd = c.fd;
  HttpRequest req = std::move(c.req);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  c.fd = -1;  // handed to the stream thread
  Close(c.id);
  auto ended = std::make_shared<std::atomic<bool>>(false);
  std::thread t([this, fd, &r, req = std::move(req), ended]() mutable {
    server_.Stream(fd, r, std::move(req));
    close(fd);
    *ended = true;
  });
  MutexLock lock(mu_);
  streams_.push_back({std::move(t), ended});
}

void HttpServer::Loop::ReapStreams(bool all) {
  std::vector<std::thread> finished;
  {
    MutexLock lock(mu_);
    auto keep = std::partition(streams_.begin(), streams_.end(), [all](const StreamThread& s) { return !all && !*s.ended; });
    for (auto it = keep; it != streams_.end(); ++it) finished.push_back(std::move(it->thread));
    streams_.erase(keep, streams_.end());
  }
  for (auto& t : finished) t.join();
}

void HttpServer::Loop::Refuse(Conn& c, int status, const std::string& why) {
  // The rest of the request is not read: the connection closes after the answer.
  Respond(c, SerializeResponse(HttpResponse::Text(why, status), c.head.method == "HEAD", false), false);
}

void HttpServer::Loop::Respond(Conn& c, std::string bytes, bool keep_alive) {
  c.out = std::move(bytes);
  c.out_done = 0;
  c.keep_alive = keep_alive;
  SetState(c, State::kWrite, Clock::now());
  Flush(c);
}

void HttpServer::Loop::Flush(Conn& c) {
  while (c.out_done < c.out.size()) {
    ssize_t n = send(c.fd, c.out.data() + c.out_done, c.out.size() - c.out_done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      SetInterest(c, EPOLLOUT);
      return;
    }
    Close(c.id);
    return;
  }
  ResponseWritten(c);
}

void HttpServer::Loop::ResponseWritten(Conn& c) {
  c.out.clear();
  c.out_done = 0;
  auto now = Clock::now();
  if (!c.keep_alive) {
    shutdown(c.fd, SHUT_WR);
    SetState(c, State::kLinger, now);
    SetInterest(c, EPOLLIN);
    return;
  }
  c.since = now;
  SetState(c, State::kIdle, now);
  SetInterest(c, EPOLLIN);
  Advance(c);  // a pipelined request may be buffered already
}

void HttpServer::Loop::SetInterest(Conn& c, uint32_t events) {
  if (c.events == events || c.fd < 0) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = c.id;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  c.events = events;
}

void HttpServer::Loop::SetState(Conn& c, State s, Clock::time_point now) {
  c.state = s;
  switch (s) {
    case State::kIdle: c.deadline = now + opts_.idle_timeout; break;
    case State::kHead: c.deadline = now + opts_.header_timeout; break;
    case State::kBody: c.deadline = now + opts_.body_timeout + ForBytes(c.head.content_length); break;
    case State::kWrite: c.deadline = now + opts_.write_timeout + ForBytes(c.out.size()); break;
    case State::kBusy: c.deadline = Clock::time_point::max(); break;
    case State::kLinger: c.deadline = now + std::chrono::seconds(2); break;
  }
}

void HttpServer::Loop::Close(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  if (c.fd >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
    close(c.fd);
  }
  auto cl = clients_.find(c.client);
  if (cl != clients_.end()) {
    if (c.state == State::kBusy) --cl->second.requests;
    if (--cl->second.conns <= 0 && cl->second.requests <= 0) clients_.erase(cl);
  }
  conns_.erase(it);
}

void HttpServer::Loop::Sweep(Clock::time_point now) {
  std::vector<std::pair<uint64_t, State>> late;
  for (const auto& [id, c] : conns_) {
    auto deadline = c->deadline;
    if (c->state == State::kBody && c->chunked) deadline += ForBytes(c->req.body.size());
    if (now > deadline) late.emplace_back(id, c->state);
  }
  for (auto [id, state] : late) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    if (state == State::kHead || state == State::kBody) {
      // A slow client is told why; the connection lingers (at most 2 s) and closes.
      Refuse(*it->second, 408, "the request did not arrive within the server's deadline");
      continue;
    }
    Close(id);
  }
}

}  // namespace torus
