// An embedded HTTP/1.1 server for the head's and the nodes' HTTP surfaces (docs/http.md), on
// civetweb (Debian's libcivetweb-dev): a small, long-maintained C server with a bounded thread
// pool, keep-alive, request-size limits and websockets, so this file only routes, checks the
// token and converts. Routes are registered before Start(); a request matches a route by
// method and path, `{}` matching one path segment (its value in HttpRequest::params) and a
// trailing '/' ignored. Unknown paths answer 404, a known path with another method 405, a body
// over the limit 413, a handler that throws 500 — each with a plain-text message, the server
// keeps serving.
//
// Token rule (Access::kToken): the cluster token as `Authorization: Bearer <token>` (what Ray
// 2.60's clients send with RAY_AUTH_MODE=token) or as the `torus_token` cookie (the dashboard's
// sign-in); none → 401, a wrong one → 403, and the handler does not run.
//
// THREADS
//  - civetweb's listener thread accepts; its `threads` worker threads each serve one connection
//    at a time and call the handlers (concurrently: handlers must be thread-safe).
//  - a websocket stream handler runs on the worker thread of its connection until it returns;
//    it must return soon after WebSocketOut::open() turns false (the peer left or Stop() began).
//  - Stop() (and the destructor) stops accepting, makes every open() false, and joins all of
//    civetweb's threads before it returns; no handler runs after it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

struct mg_context;
struct mg_connection;

namespace torus {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string path;                            // decoded, without the query
  std::string query;                           // raw, without '?'
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::vector<std::string> params;             // the path segments that matched `{}`
  std::string remote;                          // client address
  // The header's value, "" if absent (`name` lower-case).
  std::string Header(const std::string& name) const;
  // The query parameter's decoded value, or `fallback`.
  std::string Query(const std::string& name, const std::string& fallback = "") const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones
  static HttpResponse Json(std::string body, int status = 200);
  static HttpResponse Text(std::string body, int status = 200);
};

// The sending side of one websocket, valid while its stream handler runs.
class WebSocketOut {
 public:
  // One text message; false when it could not be sent (the peer left).
  bool SendText(std::string_view text);
  // False once the peer left or the server is stopping.
  bool open() const;
  // Sleeps up to `d` (less when the server stops); a ping goes out when nothing was sent for 2 s
  // (checked also for d = 0), so that a peer gone without a close frame is noticed. Returns open().
  bool Idle(std::chrono::milliseconds d);

 private:
  friend class HttpServer;
  WebSocketOut(mg_connection* conn, const std::atomic<bool>* stopping) : conn_(conn), stopping_(stopping) {}
  mg_connection* conn_;
  const std::atomic<bool>* stopping_;
  bool failed_ = false;
  std::chrono::steady_clock::time_point last_send_ = std::chrono::steady_clock::now();
};

// Equal in time independent of where they differ (for tokens).
bool SameSecret(std::string_view a, std::string_view b);

class HttpServer {
 public:
  enum class Access { kPublic, kToken };
  struct Options {
    std::string name = "http";  // for log lines and errors ("dashboard", "node agent")
    std::string host = "127.0.0.1";
    int port = 0;                // 0: any free port
    // When `port` is in use: true → listen on any free port instead (logged); false → Start fails.
    bool any_port_if_taken = false;
    int threads = 16;
    size_t max_body_bytes = 16u << 20;
    std::string token;           // the cluster token (Access::kToken)
  };
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  using StreamHandler = std::function<void(const HttpRequest&, WebSocketOut&)>;
  // Decides before the handshake: nullopt admits, a response refuses with its status and text.
  using Admit = std::function<std::optional<HttpResponse>(const HttpRequest&)>;

  explicit HttpServer(Options opts);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Before Start(). `pattern` like "/api/jobs/{}/logs".
  void Handle(const std::string& method, const std::string& pattern, Access access, Handler h);
  // A websocket endpoint (GET with an Upgrade): after the handshake `h` streams to it. `admit`
  // (optional) may refuse the request first (e.g. 404 for an unknown job).
  void HandleWebSocket(const std::string& pattern, Access access, StreamHandler h, Admit admit = nullptr);

  Status Start();
  void Stop();
  int port() const { return port_; }
  // The token rule of Access::kToken for any request: 0 when it carries the token, else 401 or
  // 403 (with the reason in *why when given).
  int TokenStatus(const HttpRequest& req, std::string* why = nullptr) const;
  // "host:port" as clients reach it (a wildcard host is given as 127.0.0.1).
  std::string address() const;

 private:
  struct Route {
    std::string method;
    std::vector<std::string> segments;
    Access access;
    Handler handler;
    StreamHandler stream;
    Admit admit;
  };
  static int OnRequest(mg_connection* conn, void* self);
  static int OnWsConnect(const mg_connection* conn, void* self);
  static void OnWsReady(mg_connection* conn, void* self);
  static int OnWsData(mg_connection* conn, int flags, char* data, size_t len, void* self);
  static void OnWsClose(const mg_connection* conn, void* self);
  HttpResponse Serve(mg_connection* conn, HttpRequest& req);
  // The route for the request (params filled); nullptr with *status 404/405.
  const Route* Match(std::vector<Route>& routes, HttpRequest& req, int* status);
  // 0 when the request may proceed, else 401/403 with *why.
  int CheckAccess(const Route& r, const HttpRequest& req, std::string* why) const;
  mg_context* StartOn(int port, std::string* error);

  Options opts_;
  std::vector<Route> routes_;
  std::vector<Route> ws_routes_;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
};

}  // namespace torus
