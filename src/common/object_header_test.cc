#include "common/object_header.h"

#include <gtest/gtest.h>

namespace torus {
namespace {

namespace hdr = object_header;

struct alignas(64) Header {
  char bytes[hdr::kBytes] = {};
};

TEST(ObjectHeader, PinsOnlyItsOwnResidentValue) {
  Header h;
  const uint64_t tag = hdr::TagOf("abc.r0");
  EXPECT_FALSE(hdr::TryPin(h.bytes, tag)) << "an unwritten header is not a value";
  hdr::Init(h.bytes, tag, 1);
  EXPECT_EQ(hdr::Pins(h.bytes), 1u);
  EXPECT_FALSE(hdr::TryPin(h.bytes, hdr::TagOf("another key"))) << "another value's header";
  EXPECT_TRUE(hdr::TryPin(h.bytes, tag));
  EXPECT_EQ(hdr::Pins(h.bytes), 2u);
  hdr::Unpin(h.bytes);
  hdr::Unpin(h.bytes);
  EXPECT_EQ(hdr::Pins(h.bytes), 0u);
}

TEST(ObjectHeader, ClaimNeedsNoPinAndStopsNewPins) {
  Header h;
  const uint64_t tag = hdr::TagOf("k");
  hdr::Init(h.bytes, tag, 1);
  EXPECT_FALSE(hdr::TryClaim(h.bytes, tag)) << "the writer still holds its pin";
  hdr::Unpin(h.bytes);
  EXPECT_FALSE(hdr::TryClaim(h.bytes, hdr::TagOf("other")));
  EXPECT_TRUE(hdr::TryClaim(h.bytes, tag));
  EXPECT_FALSE(hdr::TryPin(h.bytes, tag)) << "being spilled";
  EXPECT_FALSE(hdr::TryClaim(h.bytes, tag)) << "claimed once";
  hdr::Unclaim(h.bytes, tag);
  EXPECT_TRUE(hdr::TryPin(h.bytes, tag)) << "resident again after a failed spill";
}

TEST(ObjectHeader, TagsAreNonZeroAndFitTheirBits) {
  for (const char* k : {"", "a", "0123456789abcdef0123456789abcdef@127.0.0.1:6379", "x.copy.1234abcd"}) {
    uint64_t t = hdr::TagOf(k);
    EXPECT_NE(t, 0u) << k;
    EXPECT_EQ(hdr::TagPart(hdr::Word(t, hdr::kResident, 5)), t) << k;
    EXPECT_EQ(hdr::PinPart(hdr::Word(t, hdr::kResident, 5)), 5u) << k;
  }
}

}  // namespace
}  // namespace torus
