#include "core/conn.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/lane.h"
#include "common/rpc.h"
#include "core/task_executor.h"

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
  bool OnResults(Conn*, rpc::ResultBatch&) override { return true; }
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

// A worker's PushTasks over a real lane (and gRPC for Lane.Where): answers each task with a
// result naming it; after `close_after` tasks, it ends the stream.
class EchoWorker {
 public:
  explicit EchoWorker(int close_after = -1) : close_after_(close_after) {
    lane_.HandleStream(kPushTasksMethod, [this](LaneServerStream* s) {
      rpc::TaskBatch in;
      int served = 0;
      while (s->Read(&in)) {
        rpc::ResultBatch out;
        for (const auto& t : in.tasks()) out.add_results()->set_task_id(t.task_id());
        if (!s->Write(out)) break;
        served += in.tasks_size();
        if (close_after_ >= 0 && served >= close_after_) break;
      }
      return grpc::Status::OK;
    });
    EXPECT_GT(lane_.Start("127.0.0.1"), 0);
    int port = 0;
    server_ = StartServer("127.0.0.1", &port, {&lane_});
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  ~EchoWorker() {
    server_->Shutdown();
    lane_.Stop();
  }
  const std::string& address() const { return address_; }

 private:
  int close_after_;
  LaneServer lane_{"token", "echo worker"};
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// Records each result and the thread it was handed over on.
class Collector : public Conn::Listener {
 public:
  bool OnResults(Conn*, rpc::ResultBatch& batch) override {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& r : batch.results()) {
      got.push_back(r.task_id());
      on_caller += std::this_thread::get_id() == caller;
    }
    return true;  // one call at a time in these tests
  }
  void OnConnBroken(Conn*, const std::string&) override { broken++; }
  size_t Count() {
    std::lock_guard<std::mutex> lock(mu);
    return got.size();
  }
  std::mutex mu;
  std::vector<std::string> got;
  int on_caller = 0;
  std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> broken{0};
};

std::shared_ptr<TaskRecord> Task(int i) {
  auto t = std::make_shared<TaskRecord>();
  t->spec.set_task_id("t" + std::to_string(i));
  return t;
}

bool WaitFor(const std::function<bool()>& ok, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!ok()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Sends call `i` alone and waits for its reply as CoreWorker::Get does: reading it here when
// the stream lets it, else waiting for the reader thread. False if it never came.
bool SyncCall(Conn& c, Collector& r, int i) {
  c.Enqueue(Task(i));
  c.Flush(/*direct=*/true);
  const size_t want = static_cast<size_t>(i) + 1;
  while (r.Count() < want) {
    if (!c.ReadHere([&] { return r.Count() < want; }, std::chrono::milliseconds(5)) &&
        !WaitFor([&] { return r.Count() >= want; }, std::chrono::seconds(20))) {
      return false;
    }
  }
  return true;
}

// One synchronous call after another: after the first, the caller reads each reply itself (the
// reader thread parks), and every reply arrives once and in order.
TEST(ConnTest, ACallerOfSynchronousCallsReadsItsRepliesItself) {
  EchoWorker w;
  Collector r;
  auto c = std::make_shared<Conn>(&r, w.address(), "token");
  c->Start();
  constexpr int kCalls = 200;
  for (int i = 0; i < kCalls; ++i) ASSERT_TRUE(SyncCall(*c, r, i));
  std::lock_guard<std::mutex> lock(r.mu);
  ASSERT_EQ(r.got.size(), static_cast<size_t>(kCalls));
  for (int i = 0; i < kCalls; ++i) EXPECT_EQ(r.got[i], "t" + std::to_string(i));
  // The reader thread reads now and then (a park lasts at most Conn::kParkMax, and the first
  // call finds it reading): most replies, not all, are read by the caller.
  EXPECT_GT(r.on_caller, kCalls / 2);
}

// In synchronous mode a reply nobody asks for (a fire-and-forget call) still comes, from the
// reader thread, and so does the stream's end.
TEST(ConnTest, AParkedReaderStillDeliversWhatNobodyAsksFor) {
  EchoWorker w(/*close_after=*/4);
  Collector r;
  auto c = std::make_shared<Conn>(&r, w.address(), "token");
  c->Start();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(SyncCall(*c, r, i));
  c->Enqueue(Task(3));
  c->Flush(/*direct=*/true);  // nobody reads its reply here
  EXPECT_TRUE(WaitFor([&] { return r.Count() == 4; }, std::chrono::seconds(20)));
  EXPECT_TRUE(WaitFor([&] { return r.broken.load() == 1; }, std::chrono::seconds(20)));
  // The stream has ended: a caller cannot read it.
  EXPECT_FALSE(c->ReadHere([] { return true; }, std::chrono::milliseconds(5)));
  c->Join();
  EXPECT_EQ(r.broken.load(), 1);
}

// A caller whose reply does not come within its slice gives the stream back to the reader
// thread, which delivers the reply when it comes.
TEST(ConnTest, ACallerThatGivesUpLeavesTheReplyToTheReader) {
  EchoWorker w;
  Collector r;
  auto c = std::make_shared<Conn>(&r, w.address(), "token");
  c->Start();
  // Nothing is in flight: the read finds nothing within its slice.
  bool again = c->ReadHere([] { return true; }, std::chrono::milliseconds(20));
  EXPECT_FALSE(again);
  c->Enqueue(Task(0));
  c->Flush(/*direct=*/true);
  EXPECT_TRUE(WaitFor([&] { return r.Count() == 1; }, std::chrono::seconds(20)));
  c->Join();
}

}  // namespace
}  // namespace torus::core
