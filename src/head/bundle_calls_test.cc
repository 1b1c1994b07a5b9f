// Bytes are written here with the wire:: helpers, not by protobuf: unit tests do not link
// libprotobuf (the field numbers still come from the generated constants).
#include "head/bundle_calls.h"

#include <gtest/gtest.h>

#include <map>

#include "common/lane.h"

namespace torus {
namespace {

using R = rpc::PrepareBundlesReply;

std::string Amount(const std::string& name, double v) {
  std::string entry;
  wire::PutBytes(&entry, wire::kMapKeyField, name);
  wire::PutTag(&entry, wire::kMapValueField, 0);
  wire::PutVarint(&entry, static_cast<uint64_t>(ResourceAmount(v).units()));
  return entry;
}

// An amount as versions before fixed point wrote it (a double in ResourceSet field 1).
std::string LegacyAmount(const std::string& name, double v) {
  std::string entry;
  wire::PutBytes(&entry, wire::kMapKeyField, name);
  wire::PutDouble(&entry, wire::kMapValueField, v);
  return entry;
}

std::string Reply() {
  std::string set;
  wire::PutBytes(&set, rpc::ResourceSet::kUnitsFieldNumber, Amount("CPU", 3.5));
  wire::PutBytes(&set, rpc::ResourceSet::kUnitsFieldNumber, Amount("TPU", 4));
  wire::PutBytes(&set, rpc::ResourceSet::kUnitsFieldNumber, Amount("debt", -0.25));
  wire::PutBytes(&set, rpc::ResourceSet::kLegacyAmountsFieldNumber, LegacyAmount("old", 0.1 + 0.2));
  std::string out;
  wire::PutTag(&out, R::kOkFieldNumber, 0);
  wire::PutVarint(&out, 1);
  wire::PutBytes(&out, R::kErrorFieldNumber, "none");
  wire::PutBytes(&out, R::kAvailableFieldNumber, set);
  wire::PutTag(&out, R::kLedgerSeqFieldNumber, 0);
  wire::PutVarint(&out, 42);
  wire::PutBytes(&out, 15, "an unknown field is skipped");
  return out;
}

TEST(BundleCallsTest, ParsesEveryFieldOfAReply) {
  BundleReply r;
  r.raw = Reply();
  ASSERT_TRUE(ParseBundleReply(&r));
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.error, "none");
  EXPECT_EQ(r.ledger_seq, 42u);
  std::map<std::string, int64_t> got;
  for (const auto& a : r.available) got[std::string(r.Name(a))] = a.units;
  EXPECT_EQ(got, (std::map<std::string, int64_t>{{"CPU", 35000}, {"TPU", 40000}, {"debt", -2500}, {"old", 3000}}));
}

TEST(BundleCallsTest, RefusesATruncatedReply) {
  BundleReply r;
  r.raw = Reply();
  r.raw.resize(r.raw.size() - 3);
  EXPECT_FALSE(ParseBundleReply(&r));
}

TEST(BundleCallsTest, ReleaseRequestNamesBundlesByIndexWithIndexZeroLeftDefault) {
  std::string b0, b5, want;
  wire::PutTag(&b5, rpc::Bundle::kIndexFieldNumber, 0);
  wire::PutVarint(&b5, 5);
  wire::PutBytes(&want, rpc::BundlesRequest::kPgIdFieldNumber, "pg2");
  wire::PutBytes(&want, rpc::BundlesRequest::kBundlesFieldNumber, b0);
  wire::PutBytes(&want, rpc::BundlesRequest::kBundlesFieldNumber, b5);
  wire::PutBytes(&want, rpc::BundlesRequest::kReasonFieldNumber, "SliceLost: x");
  EXPECT_EQ(ReleasePayload("pg2", {0, 5}, "SliceLost: x"), want);
}

}  // namespace
}  // namespace torus
