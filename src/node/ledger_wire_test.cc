// The node's hand-written bundle reply (Ledger::AppendReply, the lane's hot path) checked against
// the generated protobuf: its bytes parse as the rpc::PrepareBundlesReply that Ledger::FillReply
// builds. The head's side: head/wire_codec_test.cc.
#include <gtest/gtest.h>

#include <google/protobuf/util/message_differencer.h>

#include "node/ledger.h"
#include "proto/torus.pb.h"

namespace torus {
namespace {

TEST(LedgerWireTest, LedgerReplyBytesEqualTheMessageItFills) {
  // A negative amount (CPU lent to blocked workers) is a ten-byte varint: written as protobuf does.
  Ledger ledger("node-1", ResourceMap{{"CPU", 8.5}, {"TPU", 4}, {"memory", 1e9}, {"lent", -0.25}});
  for (bool ok : {true, false}) {
    const std::string error = ok ? "" : "no room";
    std::string bytes;
    ledger.AppendReply(ok, error, &bytes);
    rpc::PrepareBundlesReply got;
    ASSERT_TRUE(got.ParseFromString(bytes));
    rpc::PrepareBundlesReply want;
    want.set_ok(ok);
    want.set_error(error);
    ledger.FillReply(&want);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, want))
        << got.DebugString() << " vs " << want.DebugString();
  }
}

}  // namespace
}  // namespace torus
