#include "common/http_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <exception>
#include <thread>

#include "common/logging.h"

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

const char* StatusText(int status) {
  const char* t = mg_get_response_code_text(nullptr, status);
  return t ? t : "";
}

// The request line and headers of `conn`.
void ReadHead(mg_connection* conn, HttpRequest* req) {
  const mg_request_info* ri = mg_get_request_info(conn);
  req->method = ri->request_method ? ri->request_method : "";
  req->path = ri->local_uri ? ri->local_uri : "/";
  req->query = ri->query_string ? ri->query_string : "";
  req->remote = ri->remote_addr;
  for (int i = 0; i < ri->num_headers; ++i) {
    std::string name = ri->http_headers[i].name ? ri->http_headers[i].name : "";
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    req->headers[name] = ri->http_headers[i].value ? ri->http_headers[i].value : "";
  }
}

// The body, up to `max` bytes: false when it is larger (nothing more is read).
bool ReadBody(mg_connection* conn, size_t max, HttpRequest* req) {
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri->content_length > 0 && static_cast<unsigned long long>(ri->content_length) > max) return false;
  if (ri->content_length > 0) req->body.reserve(static_cast<size_t>(ri->content_length));
  char buf[16384];
  for (;;) {
    int n = mg_read(conn, buf, sizeof buf);
    if (n <= 0) break;
    req->body.append(buf, static_cast<size_t>(n));
    if (req->body.size() > max) return false;
  }
  return true;
}

void SendResponse(mg_connection* conn, const HttpRequest& req, const HttpResponse& r) {
  mg_response_header_start(conn, r.status);
  mg_response_header_add(conn, "Content-Type", r.content_type.c_str(), -1);
  std::string len = std::to_string(r.body.size());
  mg_response_header_add(conn, "Content-Length", len.c_str(), -1);
  for (const auto& [k, v] : r.headers) mg_response_header_add(conn, k.c_str(), v.c_str(), -1);
  mg_response_header_send(conn);
  if (req.method != "HEAD" && !r.body.empty()) mg_write(conn, r.body.data(), r.body.size());
}

// While this thread starts a server: civetweb's messages, for the error Start() returns.
thread_local std::string* start_messages = nullptr;

int LogMessage(const mg_connection*, const char* message) {
  if (start_messages) {
    if (!start_messages->empty()) *start_messages += "; ";
    *start_messages += message;
  } else {
    TORUS_LOG(WARNING) << "http: " << message;
  }
  return 1;  // not on civetweb's stderr
}

// A websocket between its handshake and its end.
struct WsState {
  HttpRequest req;
  const HttpServer::StreamHandler* handler = nullptr;
};

}  // namespace

std::string HttpRequest::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? "" : it->second;
}

std::string HttpRequest::Query(const std::string& name, const std::string& fallback) const {
  if (query.empty()) return fallback;
  std::vector<char> buf(query.size() + 1);
  int n = mg_get_var(query.data(), query.size(), name.c_str(), buf.data(), buf.size());
  return n < 0 ? fallback : std::string(buf.data(), static_cast<size_t>(n));
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

bool WebSocketOut::SendText(std::string_view text) {
  if (!open()) return false;
  if (mg_websocket_write(conn_, MG_WEBSOCKET_OPCODE_TEXT, text.data(), text.size()) <= 0) failed_ = true;
  last_send_ = std::chrono::steady_clock::now();
  return !failed_;
}

bool WebSocketOut::open() const { return !failed_ && !stopping_->load(); }

bool WebSocketOut::Idle(std::chrono::milliseconds d) {
  // The ping is checked at least once, also for d = 0: a peer gone without a close frame is
  // noticed when a ping cannot be written (the second one after it left, within ~4 s).
  auto until = std::chrono::steady_clock::now() + d;
  do {
    auto step = std::min<std::chrono::steady_clock::duration>(std::chrono::milliseconds(100),
                                                              until - std::chrono::steady_clock::now());
    if (step > std::chrono::steady_clock::duration::zero()) std::this_thread::sleep_for(step);
    if (std::chrono::steady_clock::now() - last_send_ > std::chrono::seconds(2)) {
      if (mg_websocket_write(conn_, MG_WEBSOCKET_OPCODE_PING, "", 0) < 0) failed_ = true;
      last_send_ = std::chrono::steady_clock::now();
    }
  } while (open() && std::chrono::steady_clock::now() < until);
  return open();
}

// ------------------------------------------------------------------------------- server

HttpServer::HttpServer(Options opts) : opts_(std::move(opts)) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Handle(const std::string& method, const std::string& pattern, Access access, Handler h) {
  routes_.push_back({method, SplitPath(pattern), access, std::move(h), nullptr, nullptr});
}

void HttpServer::HandleWebSocket(const std::string& pattern, Access access, StreamHandler h, Admit admit) {
  ws_routes_.push_back({"GET", SplitPath(pattern), access, nullptr, std::move(h), std::move(admit)});
}

mg_context* HttpServer::StartOn(int port, std::string* error) {
  std::string listen = opts_.host + ":" + std::to_string(port);
  std::string threads = std::to_string(std::max(1, opts_.threads));
  const char* options[] = {"listening_ports", listen.c_str(),
                           "num_threads", threads.c_str(),
                           "request_timeout_ms", "30000",
                           "websocket_timeout_ms", "10000",
                           "enable_keep_alive", "yes",
                           "keep_alive_timeout_ms", "2000",
                           "max_request_size", "65536",
                           nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = LogMessage;
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.user_data = this;
  init.configuration_options = options;
  char text[256] = {0};
  unsigned code = 0;
  mg_error_data err{};
  err.code = &code;
  err.text = text;
  err.text_buffer_size = sizeof text;
  std::string messages;
  start_messages = &messages;
  mg_context* ctx = mg_start2(&init, &err);
  start_messages = nullptr;
  if (!ctx) *error = !messages.empty() ? messages : text[0] ? text : "civetweb could not start";
  return ctx;
}

Status HttpServer::Start() {
  mg_init_library(0);
  std::string error;
  ctx_ = StartOn(opts_.port, &error);
  if (!ctx_ && opts_.port != 0 && opts_.any_port_if_taken) {
    TORUS_LOG(WARNING) << opts_.name << ": port " << opts_.port << " is not free (" << error
                       << "); listening on another one";
    ctx_ = StartOn(0, &error);
  }
  if (!ctx_) {
    return Unavailable("the " + opts_.name + " cannot listen on " + opts_.host + ":" + std::to_string(opts_.port) +
                       ": " + error);
  }
  mg_server_port ports[4];
  std::memset(ports, 0, sizeof ports);
  int n = mg_get_server_ports(ctx_, 4, ports);
  port_ = n > 0 ? ports[0].port : opts_.port;
  mg_set_request_handler(ctx_, "**", &HttpServer::OnRequest, this);
  mg_set_websocket_handler(ctx_, "**", &HttpServer::OnWsConnect, &HttpServer::OnWsReady, &HttpServer::OnWsData,
                           &HttpServer::OnWsClose, this);
  TORUS_LOG(INFO) << opts_.name << " listening on http://" << address();
  return Status::Ok();
}

void HttpServer::Stop() {
  if (!ctx_) return;
  stopping_ = true;
  // mg_stop joins every civetweb thread; its listener notices the stop only between polls of
  // up to 2 s, so connections are made until it has: each ends one poll.
  std::atomic<bool> done{false};
  std::thread stopper([&] {
    mg_stop(ctx_);
    done = true;
  });
  std::string host = address();
  host = host.substr(0, host.rfind(':'));
  while (!done) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    inet_pton(AF_INET, host.c_str(), &a.sin_addr);
    if (fd >= 0) {
      (void)connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
      close(fd);
    }
    for (int i = 0; i < 10 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  stopper.join();
  ctx_ = nullptr;
}

std::string HttpServer::address() const {
  std::string host = opts_.host == "0.0.0.0" || opts_.host.empty() ? "127.0.0.1" : opts_.host;
  return host + ":" + std::to_string(port_);
}

const HttpServer::Route* HttpServer::Match(std::vector<Route>& routes, HttpRequest& req, int* status) {
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

HttpResponse HttpServer::Serve(mg_connection* conn, HttpRequest& req) {
  int status = 0;
  const Route* route = Match(routes_, req, &status);
  if (!route) {
    return HttpResponse::Text(status == 405 ? "method " + req.method + " is not allowed on " + req.path
                                            : "no such endpoint: " + req.path,
                              status);
  }
  std::string why;
  if (int s = CheckAccess(*route, req, &why); s != 0) return HttpResponse::Text(why, s);
  if (!ReadBody(conn, opts_.max_body_bytes, &req)) {
    mg_disable_keep_alive(conn);  // the rest of the body is not read
    return HttpResponse::Text("request body over the limit of " + std::to_string(opts_.max_body_bytes) + " bytes",
                              413);
  }
  try {
    return route->handler(req);
  } catch (const std::exception& e) {
    TORUS_LOG(ERROR) << opts_.name << ": " << req.method << " " << req.path << " failed: " << e.what();
    return HttpResponse::Text(std::string("internal error: ") + e.what(), 500);
  }
}

int HttpServer::OnRequest(mg_connection* conn, void* self) {
  auto* s = static_cast<HttpServer*>(self);
  HttpRequest req;
  ReadHead(conn, &req);  // the body is read once the route and the token are known
  HttpResponse r = s->Serve(conn, req);
  if (r.status >= 400 && r.body.empty()) r = HttpResponse::Text(StatusText(r.status), r.status);
  SendResponse(conn, req, r);
  return r.status;
}

int HttpServer::OnWsConnect(const mg_connection* cconn, void* self) {
  auto* s = static_cast<HttpServer*>(self);
  auto* conn = const_cast<mg_connection*>(cconn);  // civetweb's API: the handshake is not sent yet
  auto st = std::make_unique<WsState>();
  ReadHead(conn, &st->req);
  int status = 0;
  const Route* route = s->Match(s->ws_routes_, st->req, &status);
  std::string why;
  if (!route) {
    why = "no such websocket endpoint: " + st->req.path;
  } else if (int a = s->CheckAccess(*route, st->req, &why); a != 0) {
    status = a;
  } else if (route->admit) {
    try {
      if (auto refusal = route->admit(st->req)) {
        status = refusal->status;
        why = refusal->body;
      }
    } catch (const std::exception& e) {
      status = 500;
      why = std::string("internal error: ") + e.what();
    }
  }
  if (status != 0) {
    // Raw: civetweb's response-header calls refuse a connection already marked as a websocket.
    std::string answer = "HTTP/1.1 " + std::to_string(status) + " " + StatusText(status) +
                         "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
                         std::to_string(why.size()) + "\r\nConnection: close\r\n\r\n" + why;
    mg_write(conn, answer.data(), answer.size());
    return 1;  // no handshake; civetweb closes the connection
  }
  st->handler = &route->stream;
  mg_set_user_connection_data(cconn, st.release());
  return 0;
}

void HttpServer::OnWsReady(mg_connection* conn, void* self) {
  auto* s = static_cast<HttpServer*>(self);
  auto* st = static_cast<WsState*>(mg_get_user_connection_data(conn));
  if (!st) return;
  WebSocketOut out(conn, &s->stopping_);
  try {
    (*st->handler)(st->req, out);
  } catch (const std::exception& e) {
    TORUS_LOG(ERROR) << s->opts_.name << ": websocket " << st->req.path << " failed: " << e.what();
  }
  // A normal close (1000): the peer answers, and civetweb ends the connection.
  const char normal[2] = {'\x03', '\xe8'};
  mg_websocket_write(conn, MG_WEBSOCKET_OPCODE_CONNECTION_CLOSE, normal, sizeof normal);
}

int HttpServer::OnWsData(mg_connection*, int flags, char*, size_t, void*) {
  // Nothing is read from clients; a close ends the connection.
  return (flags & 0xf) == MG_WEBSOCKET_OPCODE_CONNECTION_CLOSE ? 0 : 1;
}

void HttpServer::OnWsClose(const mg_connection* conn, void*) {
  delete static_cast<WsState*>(mg_get_user_connection_data(conn));
  mg_set_user_connection_data(conn, nullptr);
}

}  // namespace torus
