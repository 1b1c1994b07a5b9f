#include "embedded/head_args.h"

#include <gtest/gtest.h>
#include <ray/api.h>

#include <string>

TEST(HeadArgsTest, HeadArgsShapeTheEmbeddedNode) {
  torus::NodeConfig nc;
  torus::embedded::ApplyHeadArgs({"--num-cpus=3", "--resources", R"({"r":2})", "--labels",
                                  R"({"zone":"z"})", "--object-store-memory", "1000000"},
                                 &nc);
  EXPECT_EQ(nc.resources["CPU"], 3);
  EXPECT_EQ(nc.resources["r"], 2);
  EXPECT_EQ(nc.labels["zone"], "z");
  EXPECT_EQ(nc.object_store_bytes, 1000000u);
  try {
    torus::embedded::ApplyHeadArgs({"--port", "6379"}, &nc);
    FAIL() << "an unsupported head arg was accepted";
  } catch (const ray::internal::RayException& e) {
    EXPECT_NE(std::string(e.what()).find("--port"), std::string::npos) << e.what();
  }
}
