// main() of the multi-process test binaries. The binary is both the driver (running the tests)
// and the worker: nodes start this very executable with TORUS_WORKER_MODE=1, and ray::Init() then
// serves tasks and never returns. It is also a child driver for tests that need a fresh process
// (TORUS_TEST_CHILD=<scenario>, see cluster.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <ray/api.h>

#include "cluster.h"

int main(int argc, char** argv) {
  torus_test::DisableCoreDumps();
  if (std::getenv("TORUS_WORKER_MODE")) ray::Init();  // never returns
  torus_test::RunChildScenarioIfAsked();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
