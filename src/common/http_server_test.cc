#include "common/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace torus {
namespace {

// One request over a fresh connection; the whole answer (headers and body) as sent.
std::string Exchange(int port, const std::string& raw) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return "";
  }
  (void)!write(fd, raw.data(), raw.size());
  shutdown(fd, SHUT_WR);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

int AnswerStatus(const std::string& answer) {
  auto sp = answer.find(' ');
  return sp == std::string::npos ? 0 : std::atoi(answer.c_str() + sp + 1);
}

std::string BodyOf(const std::string& answer) {
  auto i = answer.find("\r\n\r\n");
  return i == std::string::npos ? "" : answer.substr(i + 4);
}

std::string Get(int port, const std::string& path, const std::string& extra = "") {
  return Exchange(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra + "\r\n");
}

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServer::Options o;
    o.name = "test server";
    o.token = "s3cret";
    o.max_body_bytes = 1000;
    server_ = std::make_unique<HttpServer>(o);
    server_->Handle("GET", "/api/healthz", HttpServer::Access::kPublic,
                    [](const HttpRequest&) { return HttpResponse::Text("success"); });
    server_->Handle("GET", "/api/jobs/{}", HttpServer::Access::kToken, [](const HttpRequest& r) {
      return HttpResponse::Json("{\"id\":\"" + r.params[0] + "\",\"q\":\"" + r.Query("x", "none") + "\"}");
    });
    server_->Handle("POST", "/api/jobs/", HttpServer::Access::kToken,
                    [](const HttpRequest& r) { return HttpResponse::Text("got " + std::to_string(r.body.size())); });
    server_->Handle("GET", "/boom", HttpServer::Access::kPublic,
                    [](const HttpRequest&) -> HttpResponse { throw std::runtime_error("kaput"); });
    server_->HandleWebSocket("/api/tail/{}", HttpServer::Access::kToken, [](const HttpRequest& r, WebSocketOut& out) {
      for (int i = 0; i < 3 && out.open(); ++i) out.SendText(r.params[0] + "-" + std::to_string(i));
    });
    ASSERT_TRUE(server_->Start().ok());
    port_ = server_->port();
    ASSERT_GT(port_, 0);
  }
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
};

TEST_F(HttpServerTest, PublicRouteNeedsNoToken) {
  auto a = Get(port_, "/api/healthz");
  EXPECT_EQ(AnswerStatus(a), 200);
  EXPECT_EQ(BodyOf(a), "success");
}

TEST_F(HttpServerTest, TokenRouteRefusesMissingAndWrongTokens) {
  auto none = Get(port_, "/api/jobs/j1");
  EXPECT_EQ(AnswerStatus(none), 401);
  EXPECT_NE(BodyOf(none).find("Bearer"), std::string::npos);
  EXPECT_EQ(AnswerStatus(Get(port_, "/api/jobs/j1", "Authorization: Bearer wrong\r\n")), 403);
  auto ok = Get(port_, "/api/jobs/j1?x=a%20b", "Authorization: Bearer s3cret\r\n");
  EXPECT_EQ(AnswerStatus(ok), 200);
  EXPECT_EQ(BodyOf(ok), R"({"id":"j1","q":"a b"})");
  EXPECT_EQ(AnswerStatus(Get(port_, "/api/jobs/j1", "Cookie: a=b; torus_token=s3cret\r\n")), 200);
}

TEST_F(HttpServerTest, UnknownPathsAndMethods) {
  EXPECT_EQ(AnswerStatus(Get(port_, "/nope")), 404);
  EXPECT_EQ(AnswerStatus(Exchange(port_, "DELETE /api/healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")), 405);
}

TEST_F(HttpServerTest, BodyLimitAndThrowingHandlerKeepServing) {
  std::string small(10, 'a');
  auto ok = Exchange(port_, "POST /api/jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer s3cret\r\n"
                            "Content-Length: 10\r\n\r\n" + small);
  EXPECT_EQ(AnswerStatus(ok), 200) << ok;
  EXPECT_EQ(BodyOf(ok), "got 10");
  std::string big(2000, 'a');
  auto refused = Exchange(port_, "POST /api/jobs/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer s3cret\r\n"
                                 "Content-Length: 2000\r\n\r\n" + big);
  EXPECT_EQ(AnswerStatus(refused), 413);
  auto boom = Get(port_, "/boom");
  EXPECT_EQ(AnswerStatus(boom), 500);
  EXPECT_NE(BodyOf(boom).find("kaput"), std::string::npos);
  auto garbled = Exchange(port_, "\x01\x02 garbage\r\n\r\n");
  EXPECT_NE(AnswerStatus(garbled), 200);
  EXPECT_EQ(AnswerStatus(Get(port_, "/api/healthz")), 200);  // still serving
}

TEST_F(HttpServerTest, WebSocketStreamsTextThenCloses) {
  std::string upgrade = "GET /api/tail/abc HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
  auto refused = Exchange(port_, upgrade + "\r\n");
  EXPECT_EQ(AnswerStatus(refused), 401);
  auto a = Exchange(port_, upgrade + "Authorization: Bearer s3cret\r\n\r\n");
  EXPECT_EQ(AnswerStatus(a), 101) << a;
  EXPECT_NE(a.find("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), std::string::npos);  // RFC 6455's example accept key
  // Unmasked server frames: 0x81 <len> <text>, then a close frame 0x88.
  std::string frames = BodyOf(a);
  std::vector<std::string> texts;
  size_t i = 0;
  bool closed = false;
  while (i + 2 <= frames.size()) {
    auto op = static_cast<unsigned char>(frames[i]) & 0x0f;
    size_t len = static_cast<unsigned char>(frames[i + 1]) & 0x7f;
    if (op == 1) texts.push_back(frames.substr(i + 2, len));
    if (op == 8) closed = true;
    i += 2 + len;
  }
  EXPECT_EQ(texts, (std::vector<std::string>{"abc-0", "abc-1", "abc-2"}));
  EXPECT_TRUE(closed);
}

TEST(HttpServerPortTest, TakenPortFailsOrMovesAsAsked) {
  HttpServer::Options o;
  o.name = "first";
  HttpServer first(o);
  ASSERT_TRUE(first.Start().ok());
  o.port = first.port();
  o.name = "second";
  HttpServer strict(o);
  auto s = strict.Start();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("second"), std::string::npos) << s.message();
  o.any_port_if_taken = true;
  HttpServer lenient(o);
  ASSERT_TRUE(lenient.Start().ok());
  EXPECT_NE(lenient.port(), first.port());
}

}  // namespace
}  // namespace torus
