#include "core/conn.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace torus::core {
namespace {

// A loopback port nothing listens on (bound once by the kernel's choice, then closed).
int DeadPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

class Recorder : public Conn::Listener {
 public:
  void OnResults(Conn*, rpc::ResultBatch&) override {}
  void OnConnBroken(Conn*, const std::string&) override { broken++; }
  std::atomic<int> broken{0};
};

// The submitter attaches a Conn (its queue, its actor) before the Conn may report: a stream
// that fails at once used to report from the constructor's threads to a submitter that did not
// know the Conn yet, which then attached a dead stream and sent calls nobody would answer.
TEST(ConnTest, AStreamThatFailsAtOnceReportsOnlyAfterStart) {
  Recorder r;
  auto c = std::make_shared<Conn>(&r, "127.0.0.1:" + std::to_string(DeadPort()), "token");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(r.broken.load(), 0);
  c->Start();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (r.broken.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(r.broken.load(), 1);
  c->Join();
  EXPECT_EQ(r.broken.load(), 1);  // exactly once
}

}  // namespace
}  // namespace torus::core
