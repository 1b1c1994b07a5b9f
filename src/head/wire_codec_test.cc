// The head's hand-written wire codecs of the bundle calls, checked against the generated
// protobuf classes: what it writes by hand (BundlesPayload, ReleasePayload) parses as the
// rpc::BundlesRequest it stands for, and its hand reader (ParseBundleReply) reads a reply that
// protobuf serialised. The node's side: node/ledger_wire_test.cc.
#include <gtest/gtest.h>

#include <map>

#include <google/protobuf/util/message_differencer.h>

#include "head/bundle_calls.h"

namespace torus {
namespace {

rpc::PlacementGroupRecord Record() {
  rpc::PlacementGroupRecord rec;
  rec.set_pg_id("pg-7");
  for (int i = 0; i < 3; ++i) {
    auto* b = rec.add_bundles();
    b->set_index(i);
    (*b->mutable_resources()->mutable_units())["CPU"] = ResourceAmount(0.5 + i).units();
    (*b->mutable_resources()->mutable_units())["TPU"] = ResourceAmount(4).units();
    auto* t = b->add_label_selector();
    t->set_key("torus.io/tpu-slice-name");
    t->set_expr("in(s1,s2)");
    (*b->mutable_env())["MEGASCALE_SLICE_ID"] = std::to_string(i);
    b->add_env_unset("MEGASCALE_PORT");
  }
  return rec;
}

TEST(WireCodecTest, BundlesPayloadParsesAsTheRequestItWritesByHand) {
  const auto rec = Record();
  rpc::BundlesRequest got;
  ASSERT_TRUE(got.ParseFromString(BundlesPayload(rec, {0, 2})));
  rpc::BundlesRequest want;
  want.set_pg_id("pg-7");
  *want.add_bundles() = rec.bundles(0);
  *want.add_bundles() = rec.bundles(2);
  want.set_commit(true);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, want)) << got.DebugString();
}

TEST(WireCodecTest, ReleasePayloadParsesAsTheRequestItWritesByHand) {
  rpc::BundlesRequest got;
  ASSERT_TRUE(got.ParseFromString(ReleasePayload("pg-7", {0, 5}, "SliceLost: host gone")));
  EXPECT_EQ(got.pg_id(), "pg-7");
  ASSERT_EQ(got.bundles_size(), 2);
  EXPECT_EQ(got.bundles(0).index(), 0);
  EXPECT_EQ(got.bundles(1).index(), 5);
  EXPECT_EQ(got.reason(), "SliceLost: host gone");
  EXPECT_FALSE(got.commit());
  ASSERT_TRUE(got.ParseFromString(ReleasePayload("pg-8", {}, "")));
  EXPECT_EQ(got.pg_id(), "pg-8");
  EXPECT_EQ(got.bundles_size(), 0);
  EXPECT_TRUE(got.reason().empty());
}

TEST(WireCodecTest, AddressedPayloadNamesTheNodeAndKeepsTheRest) {
  NodeCall call{"node-1", "10.0.0.1:7000", ReleasePayload("pg-9", {3}, "why")};
  rpc::BundlesRequest got;
  ASSERT_TRUE(got.ParseFromString(AddressedPayload(call)));
  EXPECT_EQ(got.node_id(), "node-1");
  EXPECT_EQ(got.pg_id(), "pg-9");
  ASSERT_EQ(got.bundles_size(), 1);
  EXPECT_EQ(got.bundles(0).index(), 3);
  EXPECT_EQ(got.reason(), "why");
  call.node_id.clear();  // unknown: whichever node is at the address
  EXPECT_EQ(AddressedPayload(call), call.payload);
}

TEST(WireCodecTest, HandReaderReadsAReplyProtobufWrote) {
  rpc::PrepareBundlesReply msg;
  msg.set_ok(true);
  msg.set_error("");
  msg.set_ledger_seq(77);
  (*msg.mutable_available()->mutable_units())["CPU"] = ResourceAmount(1.25).units();
  (*msg.mutable_available()->mutable_units())["TPU"] = ResourceAmount(0).units();
  (*msg.mutable_available()->mutable_units())["over"] = ResourceAmount(-0.5).units();  // lent out
  BundleReply r;
  r.raw = msg.SerializeAsString();
  ASSERT_TRUE(ParseBundleReply(&r));
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.ledger_seq, 77u);
  std::map<std::string, int64_t> got;
  for (const auto& a : r.available) got[std::string(r.Name(a))] = a.units;
  EXPECT_EQ(got, (std::map<std::string, int64_t>{{"CPU", 12500}, {"TPU", 0}, {"over", -5000}}));
}

}  // namespace
}  // namespace torus
