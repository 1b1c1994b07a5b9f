// HttpServer against hostile and slow clients (issue 41: an HTTP port anyone could block).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/http_server.h"

namespace torus {
namespace {

// A blocking client socket whose reads give up after `timeout_s` (a blocked server fails the
// test instead of hanging it).
int Connect(int port, int timeout_s = 10) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void Send(int fd, const std::string& s) { (void)!send(fd, s.data(), s.size(), MSG_NOSIGNAL); }

// One response (head and Content-Length body) from `fd`; "" when the read timed out or the
// connection closed first. Bytes past it stay in *rest.
std::string ReadResponse(int fd, std::string* rest = nullptr) {
  std::string in = rest ? *rest : "";
  char buf[4096];
  for (;;) {
    auto end = in.find("\r\n\r\n");
    if (end != std::string::npos) {
      size_t len = 0;
      auto cl = in.find("Content-Length: ");
      if (cl != std::string::npos && cl < end) len = std::stoul(in.substr(cl + 16));
      if (in.size() >= end + 4 + len) {
        if (rest) *rest = in.substr(end + 4 + len);
        return in.substr(0, end + 4 + len);
      }
    }
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return "";
    in.append(buf, static_cast<size_t>(n));
  }
}

int StatusOf(const std::string& answer) {
  auto sp = answer.find(' ');
  return sp == std::string::npos ? 0 : std::atoi(answer.c_str() + sp + 1);
}

// True when the server closed `fd` (a read sees the end, not a timeout).
bool ClosedByServer(int fd) {
  char c;
  ssize_t n = recv(fd, &c, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

std::string Request(const std::string& path, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + extra + "\r\n";
}

const std::string kAuth = "Authorization: Bearer s3cret\r\n";

class HttpLimitsTest : public ::testing::Test {
 protected:
  void Start(HttpServer::Options o) {
    o.name = "limits test";
    o.token = "s3cret";
    server_ = std::make_unique<HttpServer>(o);
    server_->Handle("GET", "/api/healthz", HttpServer::Access::kPublic,
                    [](const HttpRequest&) { return HttpResponse::Text("success"); }, HttpServer::Lane::kProbe);
    server_->Handle("GET", "/api/version", HttpServer::Access::kToken,
                    [](const HttpRequest&) { return HttpResponse::Json("{\"version\":\"1\"}"); });
    server_->Handle("POST", "/echo", HttpServer::Access::kPublic,
                    [](const HttpRequest& r) { return HttpResponse::Text("got " + r.body); });
    server_->Handle("GET", "/slow", HttpServer::Access::kPublic, [this](const HttpRequest&) {
      std::unique_lock<std::mutex> lock(mu_);
      ++slow_running_;
      cv_.notify_all();
      cv_.wait(lock, [this] { return released_; });
      return HttpResponse::Text("slow done");
    });
    ASSERT_TRUE(server_->Start().ok());
    port_ = server_->port();
  }
  void TearDown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
    if (server_) server_->Stop();
  }
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  int slow_running_ = 0;
  bool released_ = false;
};

// The probe: 2,000 idle connections and 200 that trickle a request head byte by byte, all from
// one address, used to take every server thread (for 30 s each) so that the health probe and
// the Jobs API timed out.
TEST_F(HttpLimitsTest, IdleAndTricklingConnectionsNeverBlockProbesOrTokenRequests) {
  Start(HttpServer::Options{});
  std::vector<int> idle, slow;
  for (int i = 0; i < 2000; ++i) idle.push_back(Connect(port_));
  for (int i = 0; i < 200; ++i) {
    slow.push_back(Connect(port_));
    Send(slow.back(), "GET /api/version HTTP/1.1\r\nX-Slow: ");
  }
  for (int round = 0; round < 3; ++round) {
    for (int fd : slow) Send(fd, "a");
    int probe = Connect(port_, 5);
    ASSERT_GE(probe, 0);
    Send(probe, Request("/api/healthz"));
    EXPECT_EQ(StatusOf(ReadResponse(probe)), 200) << "round " << round;
    int api = Connect(port_, 5);
    Send(api, Request("/api/version", kAuth));
    EXPECT_EQ(StatusOf(ReadResponse(api)), 200) << "round " << round;
    close(probe);
    close(api);
  }
  for (int fd : idle) close(fd);
  for (int fd : slow) close(fd);
}

TEST_F(HttpLimitsTest, ASlowRequestHeadIsCutAtTheHeaderDeadline) {
  HttpServer::Options o;
  o.header_timeout = std::chrono::milliseconds(300);
  Start(o);
  int fd = Connect(port_, 5);
  Send(fd, "GET /api/healthz HTTP/1.1\r\n");
  std::string answer;
  for (int i = 0; i < 30 && answer.empty(); ++i) {
    Send(fd, "X: a\r\n");  // progress, but never the end of the head
    timeval tv{0, 100000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    answer = ReadResponse(fd);
  }
  EXPECT_EQ(StatusOf(answer), 408) << answer;
  close(fd);
}

TEST_F(HttpLimitsTest, AnIdleConnectionIsClosedAfterTheIdleTimeout) {
  HttpServer::Options o;
  o.idle_timeout = std::chrono::milliseconds(300);
  Start(o);
  int fd = Connect(port_, 5);
  Send(fd, Request("/api/healthz"));
  EXPECT_EQ(StatusOf(ReadResponse(fd)), 200);
  EXPECT_TRUE(ClosedByServer(fd));  // within the 5 s read timeout
  close(fd);
}

TEST_F(HttpLimitsTest, AClientOverItsConnectionLimitLosesItsOldestIdleConnection) {
  HttpServer::Options o;
  o.max_connections_per_client = 4;
  Start(o);
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) {
    fds.push_back(Connect(port_, 5));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a distinct age each
  }
  // The server has seen all four before the fifth arrives.
  for (int fd : fds) {
    Send(fd, Request("/api/healthz"));
    EXPECT_EQ(StatusOf(ReadResponse(fd)), 200);
  }
  int fifth = Connect(port_, 5);
  Send(fifth, Request("/api/healthz"));
  EXPECT_EQ(StatusOf(ReadResponse(fifth)), 200);
  EXPECT_TRUE(ClosedByServer(fds[0]));  // the oldest went
  Send(fds[3], Request("/api/healthz"));
  EXPECT_EQ(StatusOf(ReadResponse(fds[3])), 200);  // the newest stayed
  for (int fd : fds) close(fd);
  close(fifth);
}

TEST_F(HttpLimitsTest, ProbesAnswerWhilePoolThreadsAreBusyAndAClientHasALimit) {
  HttpServer::Options o;
  o.threads = 1;
  o.max_requests_per_client = 2;
  Start(o);
  int a = Connect(port_), b = Connect(port_), c = Connect(port_);
  Send(a, Request("/slow"));
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return slow_running_ == 1; });
  }
  Send(b, Request("/slow"));  // queued behind a: the client's second request
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Send(c, Request("/slow"));  // its third: refused
  auto refused = ReadResponse(c);
  EXPECT_EQ(StatusOf(refused), 503) << refused;
  EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos);
  int probe = Connect(port_, 5);
  Send(probe, Request("/api/healthz"));
  EXPECT_EQ(StatusOf(ReadResponse(probe)), 200);  // the only pool thread is busy
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
  }
  cv_.notify_all();
  EXPECT_EQ(StatusOf(ReadResponse(a)), 200);
  EXPECT_EQ(StatusOf(ReadResponse(b)), 200);
  for (int fd : {a, b, c, probe}) close(fd);
}

TEST_F(HttpLimitsTest, KeepAlivePipeliningChunkedBodiesAndExpectContinue) {
  Start(HttpServer::Options{});
  int fd = Connect(port_);
  Send(fd, Request("/api/healthz") + Request("/api/version", kAuth));
  std::string rest;
  EXPECT_EQ(StatusOf(ReadResponse(fd, &rest)), 200);
  auto second = ReadResponse(fd, &rest);
  EXPECT_EQ(StatusOf(second), 200);
  EXPECT_NE(second.find("\"version\""), std::string::npos);
  Send(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  auto chunked = ReadResponse(fd, &rest);
  EXPECT_NE(chunked.find("got abcde"), std::string::npos) << chunked;
  Send(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n");
  char buf[64] = {0};
  ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
  EXPECT_EQ(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0), "HTTP/1.1 100 Continue\r\n\r\n");
  Send(fd, "xyz");
  EXPECT_NE(ReadResponse(fd, &rest).find("got xyz"), std::string::npos);
  close(fd);
}

TEST_F(HttpLimitsTest, StopReturnsWithOpenConnectionsARunningHandlerAndAStream) {
  HttpServer::Options o;
  auto server = std::make_unique<HttpServer>(o);
  std::atomic<bool> streaming{false};
  server->HandleWebSocket("/tail", HttpServer::Access::kPublic, [&](const HttpRequest&, WebSocketOut& out) {
    streaming = true;
    while (out.Idle(std::chrono::milliseconds(50))) {
    }
  });
  ASSERT_TRUE(server->Start().ok());
  int port = server->port();
  std::vector<int> fds;
  for (int i = 0; i < 50; ++i) fds.push_back(Connect(port));
  int ws = Connect(port);
  Send(ws, Request("/tail", "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                            "Sec-WebSocket-Version: 13\r\n"));
  EXPECT_EQ(StatusOf(ReadResponse(ws)), 101);
  for (int i = 0; i < 100 && !streaming; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(streaming);
  server->Stop();
  EXPECT_TRUE(ClosedByServer(fds[0]));
  for (int fd : fds) close(fd);
  close(ws);
}

}  // namespace
}  // namespace torus
