// The physical floor of a placement-group round: one process calling every node process of the
// cluster at once over the lane (the transport the head uses for bundle calls) with the cheapest
// bundle request a node serves (releasing a group it does not hold), `--rounds` times in sequence.
// A 64-bundle SPREAD creation makes one such round from the head to 64 nodes plus the driver's
// call to the head, so bench/gang_bench.sh prints this floor next to its creation latency.
//
// With --prepare it also times the same round doing a reservation's real node work: each node
// reserves and commits one bundle ({CPU: 0.01}) of a group, as the head's round of a 64-bundle
// SPREAD creation asks it to; the bundles are released after each timed round (untimed). And
// it times a driver's no-op call to the head over the lane (head_lane_hop).
//
// Usage (TORUS_ADDRESS names a running cluster): fanout_floor [--rounds R] [--iters N] [--prepare 1]
// Prints one JSON line per measurement, like gang_bench.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/lane.h"
#include "common/rpc.h"
#include "common/session.h"
#include "proto/torus.grpc.pb.h"
#include "report.h"

int main(int argc, char** argv) {
  int rounds = 1, iters = 100;
  bool prepare = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (a == "--iters") iters = std::atoi(argv[i + 1]);
    else if (a == "--prepare") prepare = std::atoi(argv[i + 1]) != 0;
  }
  const std::string address = torus::AddressFromEnv();
  auto token = torus::FindToken();
  if (address.empty() || !token.ok()) {
    fprintf(stderr, "fanout_floor: set TORUS_ADDRESS to a running cluster (%s)\n",
            token.ok() ? "no address" : token.status().message().c_str());
    return 2;
  }
  // The list holds the removed groups the head keeps: past 4 MiB (gRPC's default) after a long
  // run of 64-bundle groups, so the channel takes replies of any size.
  auto head = torus::rpc::Head::NewStub(torus::GetChannel(address));
  torus::rpc::ListReply list;
  auto ctx = torus::NewContext(*token, 10000);
  if (auto s = head->List(ctx.get(), torus::rpc::Empty(), &list); !s.ok()) {
    fprintf(stderr, "fanout_floor: listing the cluster at %s failed: %s\n", address.c_str(),
            s.error_message().c_str());
    return 1;
  }
  // Releasing the bundles of a group the node never held: parsed, looked up under the node's
  // ledger lock, answered; nothing changes.
  torus::rpc::BundlesRequest release;
  release.set_pg_id("fanout-floor-no-such-group");
  std::vector<torus::LaneRequest> reqs;
  for (const auto& n : list.nodes()) {
    if (n.alive()) reqs.push_back({n.address(), "/torus.rpc.Node/ReleaseBundles", release.SerializeAsString()});
  }
  for (const auto& r : reqs) {
    if (!torus::HasLane(r.address, *token)) {
      fprintf(stderr, "fanout_floor: node %s has no lane\n", r.address.c_str());
      return 1;
    }
  }
  auto call = [&](const std::vector<torus::LaneRequest>& calls) {
    auto res = torus::LaneCallMany(*token, calls, 10000);
    for (const auto& r : res) {
      if (!r.delivered || !r.status.ok()) {
        fprintf(stderr, "fanout_floor: a node call failed: %s\n",
                r.delivered ? r.status.error_message().c_str() : "not delivered");
        std::exit(1);
      }
      torus::rpc::PrepareBundlesReply reply;  // a no-op release answers ok too
      if (!reply.ParseFromString(r.reply) || !reply.ok()) {
        fprintf(stderr, "fanout_floor: a node refused: %s\n", reply.error().c_str());
        std::exit(1);
      }
    }
  };
  // The warm-ups bring the connections and lanes up.
  auto us = torus::bench::Time(iters, [&] {
    for (int r = 0; r < rounds; ++r) call(reqs);
  });
  const std::string n = std::to_string(reqs.size());
  torus::bench::Report("fanout_floor_" + n + "_nodes_" + std::to_string(rounds) + "_rounds", us);
  if (!prepare) return 0;
  // One bundle per node, as the head asks each node for a SPREAD group's bundle.
  std::vector<torus::LaneRequest> reserve, undo;
  int index = 0;
  for (const auto& node : list.nodes()) {
    if (!node.alive()) continue;
    torus::rpc::BundlesRequest b;
    b.set_pg_id("fanout-floor-prepare");
    b.set_node_id(node.node_id());
    b.set_commit(true);
    auto* bundle = b.add_bundles();
    bundle->set_index(index++);
    (*bundle->mutable_resources()->mutable_units())["CPU"] = 100;  // 0.01 CPU (docs/wire.md)
    reserve.push_back({node.address(), "/torus.rpc.Node/PrepareBundles", b.SerializeAsString()});
    b.clear_commit();
    undo.push_back({node.address(), "/torus.rpc.Node/ReleaseBundles", b.SerializeAsString()});
  }
  std::vector<double> prep;
  for (int i = 0; i < iters + 3; ++i) {
    auto t0 = torus::bench::Clock::now();
    call(reserve);
    auto t1 = torus::bench::Clock::now();
    call(undo);
    if (i >= 3) prep.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  torus::bench::Report("fanout_prepare_" + n + "_nodes_1_rounds", prep);
  // A driver's call to the head over the lane that does no work (a group the head does not
  // know): the hop every creation's Create call makes on top of the head's round.
  if (!torus::HasLane(address, *token)) return 0;
  torus::rpc::PlacementGroupRequest get;
  get.set_pg_id("fanout-floor-no-such-group");
  std::vector<torus::LaneRequest> hop = {{address, "/torus.rpc.Head/GetPlacementGroup", get.SerializeAsString()}};
  auto hop_us = torus::bench::Time(iters, [&] {
    auto res = torus::LaneCallMany(*token, hop, 10000);
    if (res.empty() || !res[0].delivered || !res[0].status.ok()) {
      fprintf(stderr, "fanout_floor: the head call failed\n");
      std::exit(1);
    }
  });
  torus::bench::Report("head_lane_hop", hop_us);
  return 0;
}
