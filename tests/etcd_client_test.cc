// EtcdClient (head/etcd_client.h) against a real etcd (EtcdProcess, etcd_process.h): reads,
// paging, fenced writes, create-if-absent, leases and their expiry, waits for deletion, errors.
// Without `etcd` on PATH these tests fail (they are not skipped): CI installs it.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cluster.h"
#include "etcd_process.h"
#include "head/etcd_client.h"

namespace {

using torus::EtcdClient;
using torus::EtcdGuard;
using torus::EtcdKv;
using torus::StatusCode;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

int64_t MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      etcd_.Start();
    } catch (const std::exception& e) {
      FAIL() << e.what();
    }
    auto client = EtcdClient::Connect(etcd_.endpoint(), 5000);
    ASSERT_TRUE(client.ok()) << client.status().ToString() << "\netcd's log:\n" << etcd_.Log();
    client_ = std::move(*client);
  }
  void TearDown() override {
    client_.reset();
    etcd_.Kill();
  }

  // The key's value; "" when absent (and the test fails on an error).
  std::string Value(const std::string& key) {
    auto kv = client_->Get(key);
    EXPECT_TRUE(kv.ok()) << kv.status().ToString();
    return kv.ok() && kv->has_value() ? (*kv)->value : "";
  }
  bool Exists(const std::string& key) {
    auto kv = client_->Get(key);
    EXPECT_TRUE(kv.ok()) << kv.status().ToString();
    return kv.ok() && kv->has_value();
  }

  torus_test::EtcdProcess etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdClientTest, PutGetDelete) {
  auto absent = client_->Get("/a");
  ASSERT_TRUE(absent.ok()) << absent.status().ToString();
  EXPECT_FALSE(absent->has_value());

  const std::string binary("v\0\xff", 3);
  ASSERT_TRUE(client_->Put("/a", binary).ok());
  auto first = client_->Get("/a");
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ((*first)->key, "/a");
  EXPECT_EQ((*first)->value, binary);
  EXPECT_GT((*first)->create_revision, 0);
  EXPECT_EQ((*first)->mod_revision, (*first)->create_revision);
  EXPECT_EQ((*first)->lease, 0);

  ASSERT_TRUE(client_->Put("/a", "second").ok());
  auto second = client_->Get("/a");
  ASSERT_TRUE(second.ok() && second->has_value());
  EXPECT_EQ((*second)->value, "second");
  EXPECT_EQ((*second)->create_revision, (*first)->create_revision);
  EXPECT_GT((*second)->mod_revision, (*first)->mod_revision);

  ASSERT_TRUE(client_->Delete("/a").ok());
  EXPECT_FALSE(Exists("/a"));
  EXPECT_TRUE(client_->Delete("/a").ok()) << "deleting an absent key is fine";
}

TEST_F(EtcdClientTest, GetPrefixPagesInByteOrder) {
  // 1,200 keys (more than two pages of 500), written out of order from 4 threads, plus keys with
  // '\0' and 0xff bytes, and neighbours just outside the prefix.
  std::vector<std::string> keys;
  for (int i = 0; i < 1200; ++i) keys.push_back("/p/" + std::to_string(100000 + i * 7 % 1200));
  keys.push_back(std::string("/p/\0", 4));
  keys.push_back(std::string("/p/a\0b", 6));
  keys.push_back(std::string("/p/a\0a", 6));
  keys.push_back("/p/\xff\xff");
  std::shuffle(keys.begin(), keys.end(), std::mt19937(42));
  std::atomic<int> failures{0};
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      for (size_t i = t; i < keys.size(); i += 4) {
        if (!client_->Put(keys[i], "v" + keys[i]).ok()) ++failures;
      }
    });
  }
  for (auto& w : writers) w.join();
  ASSERT_EQ(failures, 0);
  for (const char* outside : {"/p", "/p.", "/o/x", "/q/", "/p0"}) ASSERT_TRUE(client_->Put(outside, "x").ok());

  auto all = client_->GetPrefix("/p/");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  std::vector<std::string> want = keys;
  std::sort(want.begin(), want.end());  // std::string compares bytes as unsigned char
  std::vector<std::string> got;
  for (const EtcdKv& kv : *all) {
    got.push_back(kv.key);
    EXPECT_EQ(kv.value, "v" + kv.key);
  }
  EXPECT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "GetPrefix did not return exactly the prefix's keys in byte order";

  // A prefix ending in 0xff: its range ends at the previous byte plus one.
  for (const char* k : {"/x\xff", "/x\xff\x01", "/x\xff\xff", "/y", "/x\xfe"}) {
    ASSERT_TRUE(client_->Put(k, "x").ok());
  }
  auto ff = client_->GetPrefix("/x\xff");
  ASSERT_TRUE(ff.ok()) << ff.status().ToString();
  ASSERT_EQ(ff->size(), 3u);
  EXPECT_EQ((*ff)[0].key, "/x\xff");
  EXPECT_EQ((*ff)[2].key, "/x\xff\xff");

  auto none = client_->GetPrefix("/nothing/");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_F(EtcdClientTest, CountPrefix) {
  for (int i = 0; i < 25; ++i) ASSERT_TRUE(client_->Put("/c/" + std::to_string(i), "x").ok());
  ASSERT_TRUE(client_->Put("/c", "not under /c/").ok());
  ASSERT_TRUE(client_->Put("/d/1", "x").ok());
  auto n = client_->CountPrefix("/c/");
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 25);
  ASSERT_TRUE(client_->Delete("/c/3").ok());
  EXPECT_EQ(*client_->CountPrefix("/c/"), 24);
  EXPECT_EQ(*client_->CountPrefix("/e/"), 0);
  EXPECT_EQ(*client_->CountPrefix(""), 26) << "the empty prefix counts every key";
}

TEST_F(EtcdClientTest, CreateIfAbsentWinsOnce) {
  auto lease = client_->GrantLease(30);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  auto mine = client_->CreateIfAbsent("/leader", "head-a", *lease);
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  EXPECT_EQ(mine->key, "/leader");
  EXPECT_EQ(mine->value, "head-a");
  EXPECT_EQ(mine->lease, *lease);
  EXPECT_GT(mine->create_revision, 0);

  auto theirs = client_->CreateIfAbsent("/leader", "head-b", 0);
  ASSERT_TRUE(theirs.ok()) << theirs.status().ToString();
  EXPECT_EQ(theirs->value, "head-a") << "the second caller gets the holder";
  EXPECT_EQ(theirs->create_revision, mine->create_revision);
  EXPECT_EQ(theirs->lease, *lease);
  EXPECT_EQ(Value("/leader"), "head-a");
}

TEST_F(EtcdClientTest, GuardedWritesApplyOnlyWhileTheGuardHolds) {
  auto a = client_->CreateIfAbsent("/leader", "head-a", 0);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EtcdGuard old_guard{"/leader", a->create_revision};
  ASSERT_TRUE(client_->Put("/state/x", "1", 0, old_guard).ok());
  ASSERT_TRUE(client_->Put("/state/y", "1", 0, old_guard).ok());
  ASSERT_TRUE(client_->Delete("/state/y", old_guard).ok());
  EXPECT_EQ(Value("/state/x"), "1");
  EXPECT_FALSE(Exists("/state/y"));

  // Another head takes over: the leader key is deleted and created again.
  ASSERT_TRUE(client_->Delete("/leader").ok());
  auto b = client_->CreateIfAbsent("/leader", "head-b", 0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(b->value, "head-b");
  ASSERT_NE(b->create_revision, a->create_revision);

  torus::Status put = client_->Put("/state/x", "2", 0, old_guard);
  EXPECT_EQ(put.code(), StatusCode::kFailedPrecondition) << put.ToString();
  EXPECT_NE(put.message().find("/leader"), std::string::npos) << put.message();
  torus::Status del = client_->Delete("/state/x", old_guard);
  EXPECT_EQ(del.code(), StatusCode::kFailedPrecondition) << del.ToString();
  EXPECT_EQ(Value("/state/x"), "1") << "a stale head's writes must not apply";

  EtcdGuard new_guard{"/leader", b->create_revision};
  ASSERT_TRUE(client_->Put("/state/x", "3", 0, new_guard).ok());
  EXPECT_EQ(Value("/state/x"), "3");
  ASSERT_TRUE(client_->Delete("/state/x", new_guard).ok());
  EXPECT_FALSE(Exists("/state/x"));
  // A guard whose key is gone holds nothing either.
  ASSERT_TRUE(client_->Delete("/leader").ok());
  EXPECT_EQ(client_->Put("/state/z", "1", 0, new_guard).code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(Exists("/state/z"));
}

TEST_F(EtcdClientTest, RevokedLeaseDeletesItsKeys) {
  auto lease = client_->GrantLease(30);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_NE(*lease, 0);
  ASSERT_TRUE(client_->Put("/leased", "v", *lease).ok());
  auto kv = client_->Get("/leased");
  ASSERT_TRUE(kv.ok() && kv->has_value());
  EXPECT_EQ((*kv)->lease, *lease);

  auto left = client_->KeepAlive(*lease);
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_GT(*left, 0);
  EXPECT_LE(*left, 30);

  ASSERT_TRUE(client_->RevokeLease(*lease).ok());
  EXPECT_FALSE(Exists("/leased"));
  auto expired = client_->KeepAlive(*lease);
  EXPECT_EQ(expired.status().code(), StatusCode::kNotFound) << expired.status().ToString();
  // A key cannot be bound to a lease that is gone.
  EXPECT_FALSE(client_->Put("/leased", "v", *lease).ok());
}

TEST_F(EtcdClientTest, LeaseNotKeptAliveExpires) {
  // TTL 1 s: etcd raises it to its minimum, which KeepAlive reports. Lease `kept` is renewed
  // every 300 ms and must outlive `dropped`, which is not.
  auto dropped = client_->GrantLease(1);
  auto kept = client_->GrantLease(1);
  ASSERT_TRUE(dropped.ok() && kept.ok());
  auto ttl = client_->KeepAlive(*kept);
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  std::cout << "[etcd] a lease asked for 1 s gets a TTL of " << *ttl << " s" << std::endl;
  ASSERT_GE(*ttl, 1);
  ASSERT_TRUE(client_->Put("/dropped", "v", *dropped).ok());
  ASSERT_TRUE(client_->Put("/kept", "v", *kept).ok());
  auto start = Clock::now();
  EXPECT_TRUE(Exists("/dropped"));
  int64_t gone_after_ms = -1;
  while (MsSince(start) < (*ttl + 5) * 1000) {
    ASSERT_TRUE(client_->KeepAlive(*kept).ok());
    if (!Exists("/dropped")) {
      gone_after_ms = MsSince(start);
      break;
    }
    std::this_thread::sleep_for(300ms);
  }
  ASSERT_GE(gone_after_ms, 0) << "the key of a lease not kept alive was not deleted";
  std::cout << "[etcd] the key of an unrenewed lease was gone after " << gone_after_ms << " ms"
            << std::endl;
  EXPECT_GE(gone_after_ms, (*ttl - 1) * 1000) << "deleted before its TTL";
  EXPECT_EQ(client_->KeepAlive(*dropped).status().code(), StatusCode::kNotFound);
  // Keep `kept` alive past the dropped lease's TTL once more, then check it is still there.
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(client_->KeepAlive(*kept).ok());
    std::this_thread::sleep_for(300ms);
  }
  EXPECT_TRUE(Exists("/kept")) << "a lease kept alive expired";
}

TEST_F(EtcdClientTest, KeepAliveGivesUpAtItsDeadlineWhenEtcdHangs) {
  // A leader must know by its step-down point whether it still leads: a renewal to an etcd that
  // hangs (stopped, as by a partition) ends at the deadline given, not the client's 5 s timeout.
  auto lease = client_->GrantLease(5);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_EQ(kill(etcd_.pid(), SIGSTOP), 0);
  auto start = Clock::now();
  auto left = client_->KeepAlive(*lease, std::chrono::system_clock::now() + 300ms);
  const int64_t took = MsSince(start);
  auto past = client_->KeepAlive(*lease, std::chrono::system_clock::now() - 1ms);
  kill(etcd_.pid(), SIGCONT);
  EXPECT_EQ(left.status().code(), StatusCode::kDeadlineExceeded) << left.status().ToString();
  EXPECT_LT(took, 1500) << "the renewal outlasted its deadline";
  EXPECT_EQ(past.status().code(), StatusCode::kDeadlineExceeded) << past.status().ToString();
  EXPECT_TRUE(client_->KeepAlive(*lease).ok());  // etcd answers again
}

TEST_F(EtcdClientTest, WaitDeletedSeesADeletionByAnotherThread) {
  ASSERT_TRUE(client_->Put("/w", "v").ok());
  auto kv = client_->Get("/w");
  ASSERT_TRUE(kv.ok() && kv->has_value());
  std::thread deleter([&] {
    std::this_thread::sleep_for(500ms);
    EXPECT_TRUE(client_->Delete("/w").ok());
  });
  auto start = Clock::now();
  auto deleted = client_->WaitDeleted("/w", (*kv)->mod_revision, 20000);
  int64_t ms = MsSince(start);
  deleter.join();
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_TRUE(*deleted);
  EXPECT_GE(ms, 400);
  EXPECT_LT(ms, 5000) << "the deletion was not seen promptly";
}

TEST_F(EtcdClientTest, WaitDeletedTimesOutAndSeesPastDeletions) {
  ASSERT_TRUE(client_->Put("/w", "v").ok());
  auto kv = client_->Get("/w");
  ASSERT_TRUE(kv.ok() && kv->has_value());
  // Writes that are not deletions do not end the wait.
  ASSERT_TRUE(client_->Put("/w", "v2").ok());
  auto start = Clock::now();
  auto timed_out = client_->WaitDeleted("/w", (*kv)->mod_revision, 700);
  int64_t ms = MsSince(start);
  ASSERT_TRUE(timed_out.ok()) << timed_out.status().ToString();
  EXPECT_FALSE(*timed_out);
  EXPECT_GE(ms, 600);
  EXPECT_LT(ms, 5000);

  // Absent: true at once.
  start = Clock::now();
  auto absent = client_->WaitDeleted("/never", 0, 10000);
  ASSERT_TRUE(absent.ok()) << absent.status().ToString();
  EXPECT_TRUE(*absent);
  EXPECT_LT(MsSince(start), 2000);

  // Deleted and created again after `after_revision`: the deletion is in etcd's history.
  ASSERT_TRUE(client_->Delete("/w").ok());
  ASSERT_TRUE(client_->Put("/w", "again").ok());
  start = Clock::now();
  auto past = client_->WaitDeleted("/w", (*kv)->mod_revision, 10000);
  ASSERT_TRUE(past.ok()) << past.status().ToString();
  EXPECT_TRUE(*past);
  EXPECT_LT(MsSince(start), 2000);
}

TEST_F(EtcdClientTest, CancelEndsWaits) {
  ASSERT_TRUE(client_->Put("/w", "v").ok());
  auto kv = client_->Get("/w");
  ASSERT_TRUE(kv.ok() && kv->has_value());
  std::vector<torus::StatusOr<bool>> results(2, torus::StatusOr<bool>(false));
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back([&, i] {
      results[i] = client_->WaitDeleted("/w", (*kv)->mod_revision, /*no limit*/ 0);
    });
  }
  std::this_thread::sleep_for(700ms);
  auto start = Clock::now();
  client_->Cancel();
  for (auto& w : waiters) w.join();
  EXPECT_LT(MsSince(start), 3000) << "Cancel did not end the waits promptly";
  for (const auto& r : results) EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status().ToString();
  auto later = client_->WaitDeleted("/w", (*kv)->mod_revision, 10000);
  EXPECT_EQ(later.status().code(), StatusCode::kCancelled);
  EXPECT_TRUE(client_->Get("/w").ok()) << "Cancel ends waits, not the client";
}

TEST_F(EtcdClientTest, DeadEtcdIsUnavailable) {
  etcd_.Kill();
  auto start = Clock::now();
  auto kv = client_->Get("/a");
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), StatusCode::kUnavailable) << kv.status().ToString();
  EXPECT_NE(kv.status().message().find(client_->endpoint()), std::string::npos)
      << kv.status().message();
  EXPECT_LT(MsSince(start), 6000);
}

TEST(EtcdConnectTest, NothingListeningIsUnavailable) {
  std::string endpoint = "127.0.0.1:" + std::to_string(torus_test::FreePort());
  auto start = Clock::now();
  auto client = EtcdClient::Connect(endpoint, 2000);
  int64_t ms = MsSince(start);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kUnavailable) << client.status().ToString();
  EXPECT_NE(client.status().message().find(endpoint), std::string::npos) << client.status().message();
  EXPECT_LT(ms, 2500);
}

// An etcd cluster of three: the client goes on with the members left when the one it used dies,
// and a list whose first member never answers still connects.
TEST(EtcdMembersTest, CallsGoOnWithTheMembersLeft) {
  torus_test::EtcdCluster etcd;
  etcd.Start(3);
  auto client = EtcdClient::Connect(etcd.endpoints(), 2000);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE((*client)->Put("/k", "before").ok());
  etcd.Kill(0);  // the member calls went to first
  auto start = Clock::now();
  torus::Status put = (*client)->Put("/k", "after");
  ASSERT_TRUE(put.ok()) << put.ToString();
  EXPECT_LT(MsSince(start), 3000);
  auto got = (*client)->Get("/k");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->value, "after");
  auto lease = (*client)->GrantLease(5);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_TRUE((*client)->KeepAlive(*lease).ok());
  // A fresh client given the dead member first.
  auto fresh = EtcdClient::Connect(etcd.endpoints(), 2000);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  auto again = (*fresh)->Get("/k");
  ASSERT_TRUE(again.ok() && again->has_value()) << again.status().ToString();
  EXPECT_EQ((*again)->value, "after");
  // With no member left, the error names them.
  etcd.Kill(1);
  etcd.Kill(2);
  torus::Status dead = (*client)->Put("/k", "none");
  EXPECT_FALSE(dead.ok());
}

TEST(EtcdUrlTest, ParsesHostPortAndPrefix) {
  struct Good {
    const char* url;
    const char* endpoint;
    const char* prefix;
  };
  for (const Good& g : {Good{"etcd://127.0.0.1:2379", "127.0.0.1:2379", "/torus"},
                        Good{"etcd://etcd.svc:2379/", "etcd.svc:2379", "/torus"},
                        Good{"etcd://h:1/clusters/a", "h:1", "/clusters/a"},
                        Good{"etcd://h:65535/x//", "h:65535", "/x"},
                        Good{"etcd://[::1]:2379/p", "[::1]:2379", "/p"},
                        Good{"etcd://a:1,b:2,[::1]:3/c", "a:1,b:2,[::1]:3", "/c"}}) {
    auto u = torus::ParseEtcdUrl(g.url);
    ASSERT_TRUE(u.ok()) << g.url << ": " << u.status().ToString();
    EXPECT_EQ(u->endpoint, g.endpoint) << g.url;
    EXPECT_EQ(u->prefix, g.prefix) << g.url;
  }
  for (const char* bad : {"", "etcd://", "etcd:///p", "etcd://host", "etcd://host:", "etcd://:2379",
                          "etcd://host:0", "etcd://host:65536", "etcd://host:12ab", "etcd://host:-1",
                          "http://host:2379", "host:2379", "etcd:/host:2379", "etcd://[::1]",
                          "etcd://::1:2379", "etcd://host:2379/a b", "etcd://a:1,", "etcd://a:1,,b:2",
                          "etcd://,a:1", "etcd://a:1,b"}) {
    auto u = torus::ParseEtcdUrl(bad);
    EXPECT_FALSE(u.ok()) << "accepted '" << bad << "'";
    if (!u.ok()) {
      EXPECT_EQ(u.status().code(), StatusCode::kInvalidArgument) << bad;
      EXPECT_NE(u.status().message().find("etcd://host:port"), std::string::npos) << u.status().message();
    }
  }
}

}  // namespace
