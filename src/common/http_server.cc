#include "common/http_server.h"

#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <exception>
#include <thread>

#include "common/http_loop.h"
#include "common/http_parse.h"
#include "common/logging.h"
#include "common/websocket.h"

namespace torus {

namespace {

std::vector<std::string> SplitPath(std::string_view path) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < path.size()) {
    while (i < path.size() && path[i] == '/') ++i;
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    if (j > i) out.emplace_back(path.substr(i, j - i));
    i = j;
  }
  return out;
}

}  // namespace

bool SameSecret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

namespace {

std::string CookieValue(const std::string& cookies, const std::string& name) {
  size_t i = 0;
  while (i < cookies.size()) {
    while (i < cookies.size() && (cookies[i] == ' ' || cookies[i] == ';')) ++i;
    size_t end = cookies.find(';', i);
    if (end == std::string::npos) end = cookies.size();
    std::string_view kv(cookies.data() + i, end - i);
    auto eq = kv.find('=');
    if (eq != std::string_view::npos && kv.substr(0, eq) == name) return std::string(kv.substr(eq + 1));
    i = end;
  }
  return "";
}

}  // namespace

std::string HttpRequest::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? "" : it->second;
}

std::string HttpRequest::Query(const std::string& name, const std::string& fallback) const {
  std::string value;
  return QueryValue(query, name, &value) ? value : fallback;
}

HttpResponse HttpResponse::Json(std::string body, int status) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

HttpResponse HttpResponse::Text(std::string body, int status) {
  HttpResponse r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  r.body = std::move(body);
  return r;
}

// ------------------------------------------------------------------------------- websockets

namespace {

// Writes all of `data` to the (blocking-mode agnostic) socket within 10 s, giving up early when
// the server stops. False when it could not.
bool SendAll(int fd, std::string_view data, const std::atomic<bool>& stopping) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    if (stopping.load() || std::chrono::steady_clock::now() > until) return false;
    pollfd p{fd, POLLOUT, 0};
    (void)poll(&p, 1, 100);
  }
  return true;
}

constexpr size_t kMaxClientFrame = 64 * 1024;

}  // namespace

bool WebSocketOut::Send(int opcode, std::string_view payload) {
  if (failed_) return false;
  if (!SendAll(fd_, WebSocketFrame(opcode, payload), *stopping_)) failed_ = true;
  last_send_ = std::chrono::steady_clock::now();
  return !failed_;
}

bool WebSocketOut::SendText(std::string_view text) { return open() && Send(kWsText, text); }

bool WebSocketOut::open() const { return !failed_ && !stopping_->load(); }

bool WebSocketOut::ReadPeer() {
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) failed_ = true;  // the peer left
    if (n <= 0) break;
    in_.append(buf, static_cast<size_t>(n));
  }
  WsFrame f;
  std::string why;
  while (!failed_) {
    ParseResult r = TakeWebSocketFrame(in_, kMaxClientFrame, &f, &why);
    if (r == ParseResult::kNeedMore) break;
    if (r == ParseResult::kError || f.opcode == kWsClose) failed_ = true;
    else if (f.opcode == kWsPing) Send(kWsPong, f.payload);
  }
  return !failed_;
}

bool WebSocketOut::Idle(std::chrono::milliseconds d) {
  // The ping is checked at least once, also for d = 0: a peer gone without a close frame is
  // noticed when a ping cannot be written.
  auto until = std::chrono::steady_clock::now() + d;
  do {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    int wait = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 100));
    if (poll(&p, 1, wait) > 0) ReadPeer();
    if (!failed_ && std::chrono::steady_clock::now() - last_send_ > std::chrono::seconds(2)) Send(kWsPing, "");
  } while (open() && std::chrono::steady_clock::now() < until);
  return open();
}

// ------------------------------------------------------------------------------- server

HttpServer::HttpServer(Options opts) : opts_(std::move(opts)) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Handle(const std::string& method, const std::string& pattern, Access access, Handler h,
                        Lane lane) {
  routes_.push_back({method, SplitPath(pattern), access, lane, std::move(h), nullptr, nullptr});
}

void HttpServer::HandleWebSocket(const std::string& pattern, Access access, StreamHandler h, Admit admit) {
  ws_routes_.push_back({"GET", SplitPath(pattern), access, Lane::kPool, nullptr, std::move(h), std::move(admit)});
}

Status HttpServer::Start() {
  auto loop = std::make_unique<Loop>(*this);
  std::string error;
  int port = loop->Listen(opts_.port, &error);
  if (port < 0 && opts_.port != 0 && opts_.any_port_if_taken) {
    TORUS_LOG(WARNING) << opts_.name << ": port " << opts_.port << " is not free (" << error
                       << "); listening on another one";
    port = loop->Listen(0, &error);
  }
  if (port < 0) {
    return Unavailable("the " + opts_.name + " cannot listen on " + opts_.host + ":" + std::to_string(opts_.port) +
                       ": " + error);
  }
  port_ = port;
  loop_ = std::move(loop);
  loop_->Start();
  TORUS_LOG(INFO) << opts_.name << " listening on http://" << address();
  return Status::Ok();
}

void HttpServer::Stop() {
  if (!loop_) return;
  stopping_ = true;
  loop_->Stop();
  loop_.reset();
}

std::string HttpServer::address() const {
  std::string host = opts_.host == "0.0.0.0" || opts_.host.empty() ? "127.0.0.1" : opts_.host;
  return host + ":" + std::to_string(port_);
}

const HttpServer::Route* HttpServer::Match(const std::vector<Route>& routes, HttpRequest& req, int* status) const {
  auto segs = SplitPath(req.path);
  *status = 404;
  for (const auto& r : routes) {
    if (r.segments.size() != segs.size()) continue;
    std::vector<std::string> params;
    bool ok = true;
    for (size_t i = 0; i < segs.size() && ok; ++i) {
      if (r.segments[i] == "{}") params.push_back(segs[i]);
      else ok = r.segments[i] == segs[i];
    }
    if (!ok) continue;
    bool same = r.method == req.method || (r.method == "GET" && req.method == "HEAD");
    if (!same) {
      *status = 405;
      continue;
    }
    req.params = std::move(params);
    *status = 0;
    return &r;
  }
  return nullptr;
}

int HttpServer::TokenStatus(const HttpRequest& req, std::string* why) const {
  std::string given;
  std::string auth = req.Header("authorization");
  if (auth.empty()) auth = req.Header("x-ray-authorization");  // as Ray's servers read it
  if (auth.size() > 7 && strncasecmp(auth.c_str(), "Bearer ", 7) == 0) given = auth.substr(7);
  if (given.empty()) given = CookieValue(req.Header("cookie"), "torus_token");
  if (given.empty()) {
    if (why) {
      *why = "Unauthorized: this cluster requires its token as 'Authorization: Bearer <token>' "
             "(Ray's clients send it with RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<token>)";
    }
    return 401;
  }
  if (!SameSecret(given, opts_.token)) {
    if (why) *why = "Forbidden: the token given is not this cluster's";
    return 403;
  }
  return 0;
}

int HttpServer::CheckAccess(const Route& r, const HttpRequest& req, std::string* why) const {
  return r.access == Access::kPublic ? 0 : TokenStatus(req, why);
}

HttpResponse HttpServer::Run(const Route& r, const HttpRequest& req) const {
  try {
    return r.handler(req);
  } catch (const std::exception& e) {
    TORUS_LOG(ERROR) << opts_.name << ": " << req.method << " " << req.path << " failed: " << e.what();
    return HttpResponse::Text(std::string("internal error: ") + e.what(), 500);
  }
}

void HttpServer::Stream(int fd, const Route& r, HttpRequest req) {
  std::optional<HttpResponse> refusal;
  std::string key = req.Header("sec-websocket-key");
  if (key.empty()) refusal = HttpResponse::Text("a websocket request without Sec-WebSocket-Key", 400);
  if (!refusal && r.admit) {
    try {
      refusal = r.admit(req);
    } catch (const std::exception& e) {
      refusal = HttpResponse::Text(std::string("internal error: ") + e.what(), 500);
    }
  }
  if (refusal) {
    (void)SendAll(fd, SerializeResponse(*refusal, false, false), stopping_);
    return;  // the caller closes fd
  }
  std::string handshake = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          "Sec-WebSocket-Accept: " + WebSocketAccept(key) + "\r\n\r\n";
  if (!SendAll(fd, handshake, stopping_)) return;
  WebSocketOut out(fd, &stopping_);
  try {
    r.stream(req, out);
  } catch (const std::exception& e) {
    TORUS_LOG(ERROR) << opts_.name << ": websocket " << req.path << " failed: " << e.what();
  }
  // A normal close (1000); the peer's close frame or its leaving ends the wait (at most 1 s).
  const char normal[2] = {'\x03', '\xe8'};
  if (!out.failed_ && !out.Send(kWsClose, std::string_view(normal, 2))) return;
  shutdown(fd, SHUT_WR);
  pollfd p{fd, POLLIN, 0};
  char buf[512];
  for (int i = 0; i < 10 && !stopping_ && poll(&p, 1, 100) >= 0; ++i) {
    if ((p.revents & (POLLIN | POLLHUP | POLLERR)) && recv(fd, buf, sizeof buf, MSG_DONTWAIT) <= 0) break;
  }
}

}  // namespace torus
