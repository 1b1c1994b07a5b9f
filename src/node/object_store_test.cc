// ObjectStore with a real arena segment and spill directory: spilling the oldest unpinned value
// when a range does not fit, restoring it intact, freeing spilled values, and the errors when
// nothing can be spilled.
#include "node/object_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/mman.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "common/ids.h"

namespace torus {
namespace {

namespace hdr = object_header;
namespace fs = std::filesystem;

constexpr uint64_t kValue = 1 << 20;  // 1 MiB values in a store that holds three

class ObjectStoreSpillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("torus-spill-test-" + RandomHex(6));
    name_ = "torus.sptest" + RandomHex(4) + ".arena";
    ASSERT_TRUE(store_.Open(name_, 3 * (kValue + hdr::kBytes), dir_.string()).ok());
  }
  void TearDown() override {
    store_.Clear();
    shm_unlink(("/" + name_).c_str());
    fs::remove_all(dir_);
  }
  // Creates `key` filled with `fill`; returns its offset (the writer's pin given back when
  // `unpin`), or 0 with the error in *err.
  uint64_t Put(const std::string& key, char fill, bool unpin = true, std::string* err = nullptr) {
    rpc::CreateObjectRequest req;
    req.set_object_id(key);
    req.set_key(key);
    req.set_size(kValue);
    rpc::CreateObjectReply reply;
    EXPECT_TRUE(store_.Create(req, &reply).ok());
    if (reply.has_error()) {
      if (err) *err = reply.error().message();
      return 0;
    }
    memset(Data(reply.offset()), fill, kValue);
    if (unpin) hdr::Unpin(Data(reply.offset()) - hdr::kBytes);
    return reply.offset();
  }
  char* Data(uint64_t offset);
  size_t Files() const {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir_)) n += e.path().extension() == ".spill";
    return n;
  }

  std::string node_id_ = "node-under-test";
  fs::path dir_;
  std::string name_;
  ObjectStore store_{node_id_};
  std::unique_ptr<Mapping> view_;
};

char* ObjectStoreSpillTest::Data(uint64_t offset) {
  if (!view_) {
    auto m = OpenSegment(store_.name(), /*writable=*/true);
    EXPECT_TRUE(m.ok());
    view_ = std::move(*m);
  }
  return view_->data() + offset;
}

TEST_F(ObjectStoreSpillTest, SpillsTheOldestUnpinnedValueAndRestoresItIntact) {
  uint64_t a = Put("a", 'a', /*unpin=*/false);  // still pinned: never spilled
  Put("b", 'b');
  Put("c", 'c');
  ASSERT_NE(Put("d", 'd'), 0u);  // b (the oldest unpinned) goes to disk
  EXPECT_EQ(Files(), 1u);
  auto stats = store_.GetStats();
  EXPECT_EQ(stats.spilled_objects, 1u);
  EXPECT_EQ(stats.spilled_bytes, kValue);
  EXPECT_EQ(Data(a)[kValue - 1], 'a');
  rpc::CreateObjectReply r;
  store_.Restore("b", &r);  // c is spilled to make room
  ASSERT_FALSE(r.has_error()) << r.error().message();
  EXPECT_EQ(Data(r.offset())[0], 'b');
  EXPECT_EQ(Data(r.offset())[kValue - 1], 'b');
  EXPECT_EQ(hdr::Pins(Data(r.offset()) - hdr::kBytes), 1u) << "pinned once for the caller";
  hdr::Unpin(Data(r.offset()) - hdr::kBytes);
  EXPECT_EQ(store_.GetStats().spilled_objects, 1u);
  EXPECT_EQ(Files(), 2u) << "b's file is kept: spilling b again needs no write";
  rpc::FreeObjectsRequest f;
  f.add_keys("c");  // spilled: its file goes
  store_.Free(f);
  EXPECT_EQ(Files(), 1u);
  EXPECT_EQ(store_.GetStats().spilled_bytes, 0u);
  // b is the oldest unpinned value now (a is pinned): it goes back to disk without a write.
  ASSERT_NE(Put("e", 'e'), 0u);
  ASSERT_NE(Put("f", 'f'), 0u);
  EXPECT_EQ(store_.GetStats().spilled_objects, 2u);  // b (file kept) and d (written)
  store_.Restore("b", &r);
  ASSERT_FALSE(r.has_error()) << r.error().message();
  EXPECT_EQ(Data(r.offset())[kValue / 2], 'b');
  hdr::Unpin(Data(r.offset()) - hdr::kBytes);
  f.set_keys(0, "b");
  store_.Free(f);
  EXPECT_EQ(Files(), 2u) << "d's and e's (spilled to restore b)";
}

TEST_F(ObjectStoreSpillTest, AValueLargerThanTheStoreIsRefusedWithoutSpillingAnything) {
  Put("a", 'a');
  Put("b", 'b');
  rpc::CreateObjectRequest req;
  req.set_object_id("huge");
  req.set_key("huge");
  req.set_size(4 * kValue);
  rpc::CreateObjectReply reply;
  ASSERT_TRUE(store_.Create(req, &reply).ok());
  EXPECT_NE(reply.error().message().find("too small"), std::string::npos) << reply.error().message();
  EXPECT_EQ(Files(), 0u);
  EXPECT_EQ(store_.GetStats().objects, 2u);
}

TEST_F(ObjectStoreSpillTest, AnAbandonedCreationIsFreed) {
  uint64_t a = Put("a", 'a', /*unpin=*/false);
  store_.Abandon("a", a, /*created=*/true);
  EXPECT_EQ(store_.GetStats().objects, 0u);
  EXPECT_EQ(Put("b", 'b'), a) << "its range is free again";
}

TEST_F(ObjectStoreSpillTest, FullOfPinnedValuesSaysSo) {
  Put("a", 'a', false);
  Put("b", 'b', false);
  Put("c", 'c', false);
  std::string err;
  EXPECT_EQ(Put("d", 'd', true, &err), 0u);
  EXPECT_NE(err.find("in use"), std::string::npos) << err;
  EXPECT_EQ(Files(), 0u);
  rpc::CreateObjectReply r;
  store_.Restore("nope", &r);
  EXPECT_EQ(r.error().code(), static_cast<int>(StatusCode::kNotFound)) << r.error().message();
}

TEST_F(ObjectStoreSpillTest, AFreedValueAReaderStillPinsKeepsItsRangeUntilUnpinned) {
  uint64_t a = Put("a", 'a');
  Put("b", 'b');
  Put("c", 'c');
  char* header_a = Data(a) - hdr::kBytes;
  ASSERT_TRUE(hdr::TryPin(header_a, hdr::TagOf("a")));  // a reader of a
  rpc::FreeObjectsRequest f;
  f.add_keys("a");
  store_.Free(f);
  uint64_t d = Put("d", 'd');  // spills b; a's range is still the reader's
  ASSERT_NE(d, 0u);
  EXPECT_NE(d, a);
  EXPECT_EQ(Data(a)[0], 'a');
  hdr::Unpin(header_a);  // the reader is done: the next allocation may reuse the range
  uint64_t e = Put("e", 'e');
  ASSERT_NE(e, 0u);
  EXPECT_EQ(e, a);
  EXPECT_EQ(hdr::Pins(Data(e) - hdr::kBytes), 0u);
  EXPECT_FALSE(hdr::TryPin(header_a, hdr::TagOf("a"))) << "a stale reader finds another value";
}

}  // namespace
}  // namespace torus
