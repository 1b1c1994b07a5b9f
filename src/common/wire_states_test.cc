// The text of the wire states (common/wire_states.h): each enum's values print exactly as the
// string fields they replaced did (docs/cli.md), and parse back to themselves.
#include "common/wire_states.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace torus {
namespace {

// Every value of E, in number order, prints as `want` (today's text) and parses back; nothing
// else does.
template <typename E>
void ExpectTexts(const std::vector<std::string>& want) {
  const auto* d = google::protobuf::GetEnumDescriptor<E>();
  ASSERT_EQ(d->value_count(), static_cast<int>(want.size())) << d->full_name();
  for (int i = 0; i < d->value_count(); ++i) {
    const E v = static_cast<E>(d->value(i)->number());
    EXPECT_EQ(d->value(i)->number(), i) << d->full_name() << ": numbered 0.. in order";
    EXPECT_EQ(StateName(v), want[i]) << d->full_name();
    E back = static_cast<E>(-1);
    ASSERT_TRUE(ParseState(want[i], &back).ok()) << want[i];
    EXPECT_EQ(back, v) << want[i];
  }
  E untouched = static_cast<E>(0);
  Status s = ParseState("NO_SUCH_STATE", &untouched);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"NO_SUCH_STATE\""), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(want.back()), std::string::npos) << s.message();
  EXPECT_EQ(untouched, static_cast<E>(0));
  EXPECT_EQ(StateName(static_cast<E>(99)), "") << "a number no value has";
}

TEST(WireStatesTest, TaskStates) {
  ExpectTexts<rpc::TaskInfo::State>({"PENDING_ARGS", "PENDING", "RUNNING", "FINISHED", "FAILED"});
}

TEST(WireStatesTest, PlacementGroupStates) {
  ExpectTexts<rpc::PlacementGroupRecord::State>({"PENDING", "CREATED", "REMOVED", "RESCHEDULING"});
}

TEST(WireStatesTest, SliceStatesAreLowerCase) {
  ExpectTexts<rpc::SliceSummary::State>({"free", "reserved", "broken"});
  rpc::SliceSummary::State s = rpc::SliceSummary::FREE;
  EXPECT_FALSE(ParseState("FREE", &s).ok()) << "the text is case-sensitive";
}

TEST(WireStatesTest, WorkerStatesAreLowerCase) {
  ExpectTexts<rpc::WorkerInfo::State>({"starting", "idle", "leased", "actor", "driver", "blocked"});
}

TEST(WireStatesTest, ActorStates) {
  ExpectTexts<rpc::ActorRecord::State>({"PENDING", "ALIVE", "RESTARTING", "DEAD"});
  rpc::ActorRecord::State s = rpc::ActorRecord::PENDING;
  Status st = ParseState("LIVE", &s);
  EXPECT_EQ(st.message(), "unknown actor state \"LIVE\" (one of PENDING, ALIVE, RESTARTING, DEAD)");
}

TEST(WireStatesTest, JobAndJobProcessStates) {
  ExpectTexts<rpc::JobRecord::State>({"PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"});
  ExpectTexts<rpc::JobProcessInfo::State>({"STARTING", "RUNNING", "EXITED"});
  EXPECT_FALSE(IsTerminal(rpc::JobRecord::PENDING));
  EXPECT_FALSE(IsTerminal(rpc::JobRecord::RUNNING));
  EXPECT_TRUE(IsTerminal(rpc::JobRecord::SUCCEEDED));
  EXPECT_TRUE(IsTerminal(rpc::JobRecord::FAILED));
  EXPECT_TRUE(IsTerminal(rpc::JobRecord::STOPPED));
}

// CreatePlacementGroupReply shares the placement group's enum, so its state prints the same.
TEST(WireStatesTest, CreatePlacementGroupReplyUsesTheGroupsEnum) {
  rpc::CreatePlacementGroupReply reply;
  reply.set_state(rpc::PlacementGroupRecord::CREATED);
  EXPECT_EQ(StateName(reply.state()), "CREATED");
}

// The states survive the wire: a record serialised and parsed again keeps its state.
TEST(WireStatesTest, StatesRoundTripThroughTheWire) {
  rpc::ActorRecord a;
  a.set_state(rpc::ActorRecord::RESTARTING);
  rpc::ActorRecord a2;
  ASSERT_TRUE(a2.ParseFromString(a.SerializeAsString()));
  EXPECT_EQ(StateName(a2.state()), "RESTARTING");
  rpc::SliceSummary sl;
  sl.set_state(rpc::SliceSummary::BROKEN);
  rpc::SliceSummary sl2;
  ASSERT_TRUE(sl2.ParseFromString(sl.SerializeAsString()));
  EXPECT_EQ(StateName(sl2.state()), "broken");
}

}  // namespace
}  // namespace torus
