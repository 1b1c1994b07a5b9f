#include "cli/ray_compat.h"

#include <gtest/gtest.h>

namespace torus {
namespace {

std::vector<std::string> V(std::initializer_list<const char*> l) { return {l.begin(), l.end()}; }

TEST(RayCompatTest, KubeRaysHeadCommandBecomesAForegroundTorusHeadOn6379) {
  // What KubeRay v1.5.0 runs in a head container (after `ulimit -n 65536;`).
  auto t = TranslateRay(V({"start", "--head", "--block", "--dashboard-agent-listen-port=52365",
                           "--dashboard-host=0.0.0.0", "--memory=2147483648",
                           "--metrics-export-port=8080", "--num-cpus=2"}),
                        {}, "10.0.0.5");
  ASSERT_EQ(t.error, "");
  EXPECT_EQ(t.torus_args, V({"start", "--head", "--port", "6379", "--listen-host", "0.0.0.0", "--bind", "10.0.0.5",
                             "--dashboard-agent-host", "0.0.0.0", "--block",
                             "--dashboard-agent-listen-port", "52365", "--dashboard-host", "0.0.0.0",
                             "--memory", "2147483648", "--num-cpus", "2"}));
  ASSERT_EQ(t.ignored.size(), 1u);
  EXPECT_NE(t.ignored[0].find("--metrics-export-port"), std::string::npos);
}

TEST(RayCompatTest, KubeRaysWorkerCommandJoinsWithItsResourcesAndLabels) {
  auto t = TranslateRay(V({"start", "--address=c-head-svc.ns.svc.cluster.local:6379", "--block",
                           "--resources", R"({"TPU":4})", "--labels", R"({"zone":"a","pool":"p"})",
                           "--node-ip-address", "10.0.0.9", "--object-store-memory=100000000",
                           "--port", "6380", "--dashboard-host=0.0.0.0", "--unknown-flag", "x"}),
                        {{"RAY_AUTH_TOKEN", "tok"}}, "10.0.0.5");
  ASSERT_EQ(t.error, "");
  EXPECT_EQ(t.torus_args, V({"start", "--address", "c-head-svc.ns.svc.cluster.local:6379", "--bind",
                             "10.0.0.9", "--dashboard-agent-host", "0.0.0.0", "--block", "--resources", R"({"TPU":4})", "--labels",
                             "pool=p,zone=a", "--object-store-memory", "100000000"}));
  EXPECT_EQ(t.ignored.size(), 3u);  // --port (a worker), --dashboard-host (a worker), --unknown-flag
  EXPECT_EQ(t.env.at("TORUS_TOKEN"), "tok");
}

TEST(RayCompatTest, TheOtherCommandsAndWhatIsRefused) {
  EXPECT_EQ(TranslateRay(V({"stop", "--force"}), {}, "").torus_args, V({"stop", "--force"}));
  EXPECT_EQ(TranslateRay(V({"status", "--address", "h:1"}), {}, "").torus_args,
            V({"status", "--address", "h:1"}));
  auto hc = TranslateRay(V({"health-check", "--address", "h:6379"}), {{"TORUS_TOKEN", "t"}}, "");
  EXPECT_TRUE(hc.health_check);
  EXPECT_EQ(hc.torus_args, V({"h:6379"}));
  EXPECT_TRUE(hc.env.empty());  // TORUS_TOKEN wins over RAY_AUTH_TOKEN
  EXPECT_NE(TranslateRay(V({"start", "--block"}), {}, "").error, "");
  EXPECT_NE(TranslateRay(V({"health-check"}), {}, "").error, "");
  EXPECT_NE(TranslateRay(V({"submit", "x.py"}), {}, "").error, "");
  EXPECT_NE(TranslateRay(V({"start", "--head", "--labels", "{bad"}), {}, "").error, "");
}

}  // namespace
}  // namespace torus
