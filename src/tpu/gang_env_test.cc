#include "tpu/gang_env.h"

#include <gtest/gtest.h>

namespace torus::tpu {
namespace {

TEST(GangEnv, SingleSliceRemovesMegascaleAndSetsRanks) {
  GangMember m;
  m.rank = 2;
  m.num_processes = 4;
  m.coordinator_address = "10.0.0.1:4321";
  auto c = GangEnv(m);
  EXPECT_EQ(c.set.at("TORUS_PROCESS_ID"), "2");
  EXPECT_EQ(c.set.at("TORUS_NUM_PROCESSES"), "4");
  EXPECT_EQ(c.set.at("TORUS_COORDINATOR_ADDRESS"), "10.0.0.1:4321");
  EXPECT_EQ(c.set.at("JAX_COORDINATOR_ADDRESS"), "10.0.0.1:4321");
  EXPECT_EQ(c.set.at("TORUS_SLICE_INDEX"), "0");
  EXPECT_EQ(c.set.count("MEGASCALE_NUM_SLICES"), 0u);
  EXPECT_EQ(c.unset, (std::vector<std::string>{"MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES",
                                               "MEGASCALE_PORT", "MEGASCALE_SLICE_ID"}));
  std::map<std::string, std::string> env = {{"MEGASCALE_NUM_SLICES", "3"}};
  c.ApplyTo(&env);
  EXPECT_EQ(env.count("MEGASCALE_NUM_SLICES"), 0u);
}

TEST(GangEnv, MultisliceNamesSliceZeroHostZero) {
  GangMember m;
  m.rank = 2;
  m.num_processes = 4;
  m.slice_index = 1;
  m.num_slices = 2;
  m.epoch = 2;
  m.coordinator_address = "h0:5000";
  m.megascale_host = "h0";
  auto c = GangEnv(m);
  EXPECT_EQ(c.set.at("MEGASCALE_COORDINATOR_ADDRESS"), "h0");
  EXPECT_EQ(c.set.at("MEGASCALE_PORT"), "8081");
  EXPECT_EQ(c.set.at("MEGASCALE_NUM_SLICES"), "2");
  EXPECT_EQ(c.set.at("MEGASCALE_SLICE_ID"), "1");
  EXPECT_EQ(c.set.at("TORUS_RESERVATION_EPOCH"), "2");
  EXPECT_TRUE(c.unset.empty());
  m.gen = Generation::kV7x;
  EXPECT_EQ(GangEnv(m).set.at("MEGASCALE_COORDINATOR_ADDRESS"), "h0:8081");
}

TEST(GangEnv, MegascaleEnvIsTheMegascalePartOfGangEnv) {
  auto c = MegascaleEnv(Generation::kV5p, "10.0.0.7", 3, 2);
  EXPECT_EQ(c.set.size(), 4u);
  EXPECT_EQ(c.set.at("MEGASCALE_COORDINATOR_ADDRESS"), "10.0.0.7");
  EXPECT_EQ(c.set.at("MEGASCALE_NUM_SLICES"), "3");
  EXPECT_EQ(c.set.at("MEGASCALE_SLICE_ID"), "2");
  EXPECT_TRUE(c.unset.empty());
  EXPECT_EQ(MegascaleEnv(Generation::kV7x, "h", 2, 0).set.at("MEGASCALE_COORDINATOR_ADDRESS"), "h:8081");
  auto one = MegascaleEnv(Generation::kV7x, "h", 1, 0);
  EXPECT_TRUE(one.set.empty());
  EXPECT_EQ(one.unset, (std::vector<std::string>{"MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES",
                                                 "MEGASCALE_PORT", "MEGASCALE_SLICE_ID"}));
}

}  // namespace
}  // namespace torus::tpu
