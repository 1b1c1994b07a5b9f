// The lane's framing (common/lane_frame.h): frames cut out of received bytes, and addresses.
#include "common/lane_frame.h"

#include <gtest/gtest.h>

#include <cstring>

namespace torus {
namespace {

std::string Frame(LaneKind kind, uint16_t code, std::string_view text, std::string_view payload) {
  LaneHeader h{kLaneMagic, kind, 0, code, static_cast<uint32_t>(text.size()),
               static_cast<uint32_t>(payload.size())};
  std::string out(reinterpret_cast<const char*>(&h), sizeof h);
  out.append(text);
  out.append(payload);
  return out;
}

TEST(LaneFrameTest, InboxCutsWholeFramesAndWaitsForTheRest) {
  LaneInbox in;
  const std::string a = Frame(kLaneCall, 0, "/torus.rpc.Node/Prepare", "abc");
  const std::string b = Frame(kLaneReply, 5, "not found", "");
  in.Append(a + b.substr(0, 7));  // the second frame is cut inside its header
  LaneHeader h{};
  std::string_view text, payload;
  std::string why;
  const uint32_t kinds = (1u << kLaneCall) | (1u << kLaneReply);
  ASSERT_EQ(in.Next(kinds, &h, &text, &payload, &why), 1);
  EXPECT_EQ(h.kind, kLaneCall);
  EXPECT_EQ(text, "/torus.rpc.Node/Prepare");
  EXPECT_EQ(payload, "abc");
  EXPECT_EQ(in.Next(kinds, &h, &text, &payload, &why), 0);
  in.Append(b.substr(7));
  ASSERT_EQ(in.Next(kinds, &h, &text, &payload, &why), 1);
  EXPECT_EQ(h.kind, kLaneReply);
  EXPECT_EQ(h.code, 5);
  EXPECT_EQ(text, "not found");
  EXPECT_TRUE(payload.empty());
  EXPECT_EQ(in.Next(kinds, &h, &text, &payload, &why), 0);
}

TEST(LaneFrameTest, InboxRefusesUnexpectedKindsBadMagicAndNamelessCalls) {
  LaneHeader h{};
  std::string_view text, payload;
  std::string why;
  {
    LaneInbox in;
    in.Append(Frame(kLaneMsg, 0, "", "x"));
    EXPECT_EQ(in.Next(1u << kLaneReply, &h, &text, &payload, &why), -1);
    EXPECT_NE(why.find("malformed frame"), std::string::npos) << why;
  }
  {
    LaneInbox in;
    std::string f = Frame(kLaneReply, 0, "", "");
    f[0] ^= 1;  // magic
    in.Append(f);
    EXPECT_EQ(in.Next(1u << kLaneReply, &h, &text, &payload, &why), -1);
  }
  {
    LaneInbox in;
    in.Append(Frame(kLaneCall, 0, "", "payload"));  // a call names its method
    EXPECT_EQ(in.Next(1u << kLaneCall, &h, &text, &payload, &why), -1);
  }
}

TEST(LaneFrameTest, SplitHostPortTakesTheLastColonAndUnbracketsV6) {
  std::string host, port;
  ASSERT_TRUE(lane_internal::SplitHostPort("10.0.0.1:7379", &host, &port));
  EXPECT_EQ(host, "10.0.0.1");
  EXPECT_EQ(port, "7379");
  ASSERT_TRUE(lane_internal::SplitHostPort("[::1]:80", &host, &port));
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, "80");
  EXPECT_FALSE(lane_internal::SplitHostPort("nohost", &host, &port));
  EXPECT_FALSE(lane_internal::SplitHostPort(":80", &host, &port));
  EXPECT_FALSE(lane_internal::SplitHostPort("host:", &host, &port));
}

}  // namespace
}  // namespace torus
