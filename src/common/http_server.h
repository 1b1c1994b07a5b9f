// An embedded HTTP/1.1 server for the head's and the nodes' HTTP surfaces (docs/http.md), our own
// on epoll: no thread is tied to a connection, so idle, slow or hostile clients cost a few
// kilobytes each and can never starve the handlers or the health probes. Routes are registered
// before Start(); a request matches a route by method and path, `{}` matching one path segment
// (its value in HttpRequest::params) and a trailing '/' ignored. Unknown paths answer 404, a known
// path with another method 405, a body over the limit 413, a handler that throws 500 — each with a
// plain-text message, the server keeps serving.
//
// Token rule (Access::kToken): the cluster token as `Authorization: Bearer <token>` (what Ray
// 2.60's clients send with RAY_AUTH_MODE=token) or as the `torus_token` cookie (the dashboard's
// sign-in); none → 401, a wrong one → 403, and the handler does not run.
//
// Hostile clients (Options): a request head must arrive within `header_timeout` of its first byte
// (slow-loris), a body within `body_timeout` (plus 1 s per 64 KiB), a response be taken within
// `write_timeout`; a connection idle for `idle_timeout` is closed. A client address holds at most
// `max_connections_per_client` connections and the server `max_connections`: past either, the
// oldest connection of that client (or of all) that is not running a request is closed to admit
// the new one. A client has at most `max_requests_per_client` requests queued or running, and the
// pool queue at most `max_queued` (503 past either). Lane::kProbe routes (health probes) run on a
// thread of their own, never queued behind other requests.
//
// THREADS
//  - one event-loop thread accepts, reads and parses requests, checks routes and the token,
//    answers refusals itself and writes every response; it owns all connection state.
//  - `threads` pool threads run Lane::kPool handlers, one probe thread Lane::kProbe handlers
//    (concurrently: handlers must be thread-safe); a handler's response goes back to the loop.
//  - a websocket stream handler runs on a thread of its own (at most `max_streams` at once, 503
//    past it) until it returns; it must return soon after WebSocketOut::open() turns false (the
//    peer left or Stop() began).
//  - Stop() (and the destructor) stops accepting, closes every connection, makes every open()
//    false, lets running handlers finish and joins every thread before it returns; no handler
//    runs after it.
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
  WebSocketOut(int fd, const std::atomic<bool>* stopping) : fd_(fd), stopping_(stopping) {}
  bool Send(int opcode, std::string_view payload);
  // Reads what the peer sent (close, ping) without blocking; false once it left.
  bool ReadPeer();
  int fd_;
  const std::atomic<bool>* stopping_;
  bool failed_ = false;
  std::string in_;
  std::chrono::steady_clock::time_point last_send_ = std::chrono::steady_clock::now();
};

// Equal in time independent of where they differ (for tokens).
bool SameSecret(std::string_view a, std::string_view b);

class HttpServer {
 public:
  enum class Access { kPublic, kToken };
  // kProbe: a cheap handler (a health probe) run on the probe thread, never behind other work.
  enum class Lane { kPool, kProbe };
  struct Options {
    std::string name = "http";  // for log lines and errors ("dashboard", "node agent")
    std::string host = "127.0.0.1";
    int port = 0;                // 0: any free port
    // When `port` is in use: true → listen on any free port instead (logged); false → Start fails.
    bool any_port_if_taken = false;
    int threads = 8;             // pool threads running handlers
    size_t max_body_bytes = 16u << 20;
    std::string token;           // the cluster token (Access::kToken)
    // Hostile and slow clients (see the file comment).
    int max_connections = 8192;  // also at most half the process's open-file limit
    int max_connections_per_client = 256;
    int max_requests_per_client = 64;
    int max_queued = 1024;
    int max_streams = 64;
    std::chrono::milliseconds header_timeout{10000};
    std::chrono::milliseconds body_timeout{30000};
    std::chrono::milliseconds write_timeout{30000};
    std::chrono::milliseconds idle_timeout{5000};
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
  void Handle(const std::string& method, const std::string& pattern, Access access, Handler h,
              Lane lane = Lane::kPool);
  // A websocket endpoint (GET with an Upgrade): after the handshake `h` streams to it. `admit`
  // (optional) may refuse the request first (e.g. 404 for an unknown job).
  void HandleWebSocket(const std::string& pattern, Access access, StreamHandler h, Admit admit = nullptr);

  // Listens and starts the threads; also raises the process's open-file soft limit to its hard
  // limit (connections are files).
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
    Lane lane;
    Handler handler;
    StreamHandler stream;
    Admit admit;
  };
  struct Loop;  // the event loop and its threads (http_server.cc)
  friend struct Loop;
  // The route for the request (params filled); nullptr with *status 404/405.
  const Route* Match(const std::vector<Route>& routes, HttpRequest& req, int* status) const;
  // 0 when the request may proceed, else 401/403 with *why.
  int CheckAccess(const Route& r, const HttpRequest& req, std::string* why) const;
  // Runs a route's handler; a throw becomes a 500.
  HttpResponse Run(const Route& r, const HttpRequest& req) const;
  // A websocket's life on its stream thread: admission, handshake, the handler, the close.
  void Stream(int fd, const Route& r, HttpRequest req);

  // Constant after Start().
  Options opts_;
  std::vector<Route> routes_;
  std::vector<Route> ws_routes_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<Loop> loop_;
};

}  // namespace torus
