#include "common/tcp_relay.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>

namespace torus {
namespace {

// A TCP server on 127.0.0.1 that answers each line-less read with `tag` + what it read.
class EchoServer {
 public:
  explicit EchoServer(std::string tag) : tag_(std::move(tag)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    listen(fd_, 16);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        std::thread([c, tag = tag_] {
          char buf[4096];
          ssize_t n;
          while ((n = read(c, buf, sizeof buf)) > 0) {
            std::string out = tag + std::string(buf, static_cast<size_t>(n));
            (void)!write(c, out.data(), out.size());
          }
          close(c);
        }).detach();
      }
    });
  }
  ~EchoServer() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  std::string tag_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// What one exchange returns: the reply, or "" when the relay closed the connection.
std::string Ask(int fd, const std::string& what) {
  (void)!write(fd, what.data(), what.size());
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

TEST(TcpRelayTest, JoinsCallersToTheUpstreamAndMovesWithIt) {
  EchoServer one("one:"), two("two:");
  TcpRelay relay;
  auto port = relay.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status().message();
  relay.SetUpstream(one.address());
  int a = Connect(*port);
  EXPECT_EQ(Ask(a, "hello"), "one:hello");
  std::string big(200000, 'x');  // more than one read, both ways
  (void)!write(a, big.data(), big.size());
  size_t got = 0;
  char buf[65536];
  while (got < big.size()) {
    ssize_t n = read(a, buf, sizeof buf);
    ASSERT_GT(n, 0);
    got += static_cast<size_t>(n);
  }
  EXPECT_GE(got, big.size());
  // A new upstream: the old connection closes, a new one reaches the new upstream.
  relay.SetUpstream(two.address());
  EXPECT_EQ(Ask(a, "again"), "");
  close(a);
  int b = Connect(*port);
  EXPECT_EQ(Ask(b, "hi"), "two:hi");
  close(b);
  EXPECT_EQ(relay.joined(), 2);
  // No upstream: callers are closed at once (they retry).
  relay.SetUpstream("");
  int c = Connect(*port);
  EXPECT_EQ(Ask(c, "anyone?"), "");
  close(c);
  relay.Stop();
  // The port is free again for the head that takes it over.
  int s = socket(AF_INET, SOCK_STREAM, 0);
  int one_opt = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one_opt, sizeof one_opt);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  close(s);
}

TEST(TcpRelayTest, AnUpstreamThatIsGoneClosesTheCaller) {
  TcpRelay relay;
  auto port = relay.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  relay.SetUpstream("127.0.0.1:1");  // nothing listens there
  int c = Connect(*port);
  EXPECT_EQ(Ask(c, "x"), "");
  close(c);
  EXPECT_EQ(relay.joined(), 0);
}

}  // namespace
}  // namespace torus
