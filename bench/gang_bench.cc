// Gang-reservation latency on a running cluster (TORUS_ADDRESS): placement-group creation
// against bundle count, and whole-slice reserve+release against slice size. Driven by
// bench/gang_bench.sh, which starts the simulated clusters. Prints one JSON object per row:
//   {"name": "pg_create_latency_64_bundles", "median_us": 812.0, "p90_us": 990.1, "n": 200}
// Usage: gang_bench --sweep 1,4,16,64 [--iters N]
//        gang_bench --slice TOPOLOGY --accelerator VER [--iters N]
#include <ray/api.h>
#include <torus/tpu.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "report.h"

using torus::bench::Clock;
using torus::bench::Report;
using torus::bench::Time;

int main(int argc, char** argv) {
  std::string sweep, topology, accel;
  int iters = 100;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--sweep") sweep = argv[i + 1];
    else if (a == "--slice") topology = argv[i + 1];
    else if (a == "--accelerator") accel = argv[i + 1];
    else if (a == "--iters") iters = std::atoi(argv[i + 1]);
  }
  ray::Init();
  if (!sweep.empty()) {
    std::stringstream ss(sweep);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
      int bundles = std::stoi(tok);
      // Creation latency: CreatePlacementGroup until Wait returns (every bundle prepared and
      // committed on its node). SPREAD puts each bundle on its own node while nodes last, so it
      // measures the fan-out to `bundles` node processes; PACK puts them all on one node (they
      // fit), so it measures how the head's decision and the prepare scale with bundle count.
      for (auto strategy : {ray::PlacementStrategy::SPREAD, ray::PlacementStrategy::PACK}) {
        std::vector<double> create;
        auto one = [&](bool timed) {
          ray::PlacementGroupCreationOptions o;
          o.strategy = strategy;
          o.bundles.assign(bundles, {{"CPU", 0.01}});
          auto t0 = Clock::now();
          auto pg = ray::CreatePlacementGroup(o);
          if (!pg.Wait(60)) {
            fprintf(stderr, "placement group of %d bundles not created in 60 s\n", bundles);
            std::exit(1);
          }
          if (timed) create.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
          ray::RemovePlacementGroup(pg.GetID());
        };
        for (int i = 0; i < 3; ++i) one(false);
        for (int i = 0; i < iters; ++i) one(true);
        Report(std::string(strategy == ray::PlacementStrategy::PACK ? "pg_create_latency_pack_"
                                                                     : "pg_create_latency_") +
                   tok + "_bundles",
               create);
      }
    }
  }
  if (!topology.empty()) {
    torus::tpu::SliceOptions o;
    o.topology = topology;
    o.accelerator_version = accel;
    int hosts = 0;
    std::vector<double> reserve, release;  // the two halves of each timed round
    auto us = Time(iters, [&] {
      auto t0 = Clock::now();
      auto s = torus::tpu::CreateSlicePlacementGroup(o);
      if (!s.Wait(60)) {
        fprintf(stderr, "slice %s %s not reserved in 60 s\n", accel.c_str(), topology.c_str());
        std::exit(1);
      }
      auto t1 = Clock::now();
      hosts = s.NumHosts();
      s.Remove();
      reserve.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      release.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t1).count());
    });
    reserve.erase(reserve.begin(), reserve.begin() + 3);  // the warm-ups
    release.erase(release.begin(), release.begin() + 3);
    std::string tag = accel + "_" + topology + "_" + std::to_string(hosts) + "_hosts";
    Report("slice_reserve_release_" + tag, us);
    Report("slice_reserve_only_" + tag, reserve);
    Report("slice_release_only_" + tag, release);
  }
  ray::Shutdown();
  return 0;
}
