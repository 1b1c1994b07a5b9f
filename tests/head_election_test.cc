// HeadElection and EtcdHeadStore (head/head_election.h, head/etcd_store.h) against a real etcd:
// one active head at a time, a standby that takes over when the active one's lease goes, the
// cluster token written once, fenced writes that tell the deposed head, records too large for
// etcd refused up front, and the heads' list with the active first.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <string>
#include <thread>

#include "etcd_process.h"
#include "head/etcd_store.h"
#include "head/head_election.h"

namespace {

using torus::EtcdHeadStore;
using torus::HeadElection;
using torus::StatusCode;
using torus::StoreKind;
using Clock = std::chrono::steady_clock;

class HeadElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      etcd_.Start();
    } catch (const std::exception& e) {
      FAIL() << e.what();
    }
    url_ = "etcd://" + etcd_.endpoint() + "/election-test";
  }
  void TearDown() override { etcd_.Kill(); }

  std::unique_ptr<HeadElection> Connect(const std::string& address) {
    auto e = HeadElection::Connect({url_, address});
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(*e) : nullptr;
  }

  torus_test::EtcdProcess etcd_;
  std::string url_;
};

TEST_F(HeadElectionTest, OneActiveTheOtherStandsByAndTakesOverWhenItStops) {
  auto a = Connect("127.0.0.1:1001");
  auto b = Connect("127.0.0.1:1002");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Campaign([](const std::string&) {}).ok());
  EXPECT_EQ(*a->ActiveNow(), "127.0.0.1:1001");
  // Tokens pass the token rule (CleanToken): at least 16 printable characters.
  EXPECT_EQ(*a->ClusterToken("token-of-head-a-0123"), "token-of-head-a-0123");
  EXPECT_EQ(*b->ClusterToken("token-of-head-b-0123"), "token-of-head-a-0123");  // written once: the first head's

  std::atomic<bool> b_active{false};
  std::string seen;
  std::thread t([&] {
    auto s = b->Campaign([&](const std::string& active) { seen = active; });
    b_active = s.ok();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(b_active.load());
  auto heads = a->Heads();
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // a renewal re-reads the list
  heads = a->Heads();
  ASSERT_EQ(heads.size(), 2u);
  EXPECT_EQ(heads[0], "127.0.0.1:1001");  // the active first
  EXPECT_EQ(heads[1], "127.0.0.1:1002");

  auto stopped = Clock::now();
  a->Stop();  // revokes the lease: the standby takes over at once, not after the TTL
  t.join();
  EXPECT_TRUE(b_active.load());
  EXPECT_EQ(seen, "127.0.0.1:1001");
  EXPECT_LT(Clock::now() - stopped, std::chrono::milliseconds(1500));
  EXPECT_EQ(*b->ActiveNow(), "127.0.0.1:1002");
}

TEST_F(HeadElectionTest, ADeposedHeadsWritesAreFencedAndItIsTold) {
  auto a = Connect("127.0.0.1:2001");
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->Campaign([](const std::string&) {}).ok());
  std::atomic<int> lost{0};
  std::string why;
  a->OnLost([&](const std::string& w) {
    why = w;
    ++lost;
  });
  auto store = a->OpenStore();
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE((*store)->Put(StoreKind::kActor, "x", "1").ok());
  // Another head becomes active behind this one's back (its leader key replaced).
  auto raw = EtcdHeadStore::Open(url_, {});
  ASSERT_TRUE(raw.ok());
  auto client = torus::EtcdClient::Connect(etcd_.endpoint());
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Delete("/election-test/leader").ok());
  ASSERT_TRUE((*client)->Put("/election-test/leader", "127.0.0.1:2002").ok());
  auto s = (*store)->Put(StoreKind::kActor, "x", "2");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(lost.load(), 1);
  EXPECT_NE(why.find("fenced"), std::string::npos) << why;
  auto all = (*raw)->LoadAll(StoreKind::kActor);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].second, "1");  // the deposed head's write did not land
}

TEST_F(HeadElectionTest, AnActiveHeadCutOffFromEtcdStepsDownBeforeItsLeaseCanExpire) {
  // Fencing by time: etcd stops answering (a partition) at several points of the renewal cycle;
  // each time the active head is told it lost the leadership within TTL - kStepDownMs (1.5 s)
  // of its last renewal, so well before etcd could expire its 2 s lease and let another head in.
  for (int phase_ms : {0, 250, 500}) {
    auto a = Connect("127.0.0.1:300" + std::to_string(phase_ms / 250));
    ASSERT_TRUE(a);
    ASSERT_TRUE(a->Campaign([](const std::string&) {}).ok());
    std::atomic<int64_t> lost_at{0};
    a->OnLost([&](const std::string&) { lost_at = Clock::now().time_since_epoch().count(); });
    std::this_thread::sleep_for(std::chrono::milliseconds(700 + phase_ms));
    ASSERT_EQ(kill(etcd_.pid(), SIGSTOP), 0);
    const auto stopped = Clock::now();
    while (lost_at.load() == 0 && Clock::now() - stopped < std::chrono::seconds(5)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kill(etcd_.pid(), SIGCONT);
    ASSERT_NE(lost_at.load(), 0) << "phase " << phase_ms << " ms: the cut-off head kept leading";
    const auto took = Clock::time_point(Clock::duration(lost_at.load())) - stopped;
    EXPECT_LT(took, std::chrono::milliseconds(1800)) << "phase " << phase_ms << " ms";
    a.reset();  // revokes its lease (etcd answers again), so the next head leads at once
  }
}

TEST_F(HeadElectionTest, ARecordTooLargeForEtcdIsRefusedNamingItsSize) {
  auto store = EtcdHeadStore::Open(url_, {});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto s = (*store)->Put(StoreKind::kKv, "big", std::string(2 << 20, 'x'));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("2097152 bytes"), std::string::npos) << s.message();
  EXPECT_TRUE((*store)->Put(StoreKind::kKv, "fits", std::string(1 << 20, 'x')).ok());
}

TEST_F(HeadElectionTest, AnUnreachableEtcdOrABadUrlFailsClearly) {
  auto bad = HeadElection::Connect({"etcd://nohost", "127.0.0.1:1"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  etcd_.Kill();
  auto gone = HeadElection::Connect({url_, "127.0.0.1:1"});
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(gone.status().message().find("--state " + url_), std::string::npos) << gone.status().message();
}

}  // namespace
