// Scheduler-only benchmark: the head's slice decision over a large simulated cluster, without
// processes or RPCs. Builds the head's live slice index (head/slice_index.h) for N hosts of
// v6e 4x4 slices (4 hosts each) and times one reservation decision: pick the first idle
// intact slice, then apply the grant to the index (its 4 hosts become busy, as their ledgers
// report), and release it again (hosts idle). Google Benchmark; run:
//   build/bench/slice_sched_bench --benchmark_filter=.    (issue target: < 100 us at 10,000 hosts)
#include <benchmark/benchmark.h>

#include <deque>
#include <memory>
#include <string>

#include "head/slice_index.h"

namespace {

// The index views node ids (in the head they are its node table's keys, which live as long as
// the head): the cluster keeps them alive for as long as its index.
struct Cluster {
  std::deque<std::string> node_ids;
  torus::SliceIndex index;
};

std::unique_ptr<Cluster> MakeCluster(int hosts, double held_fraction) {
  auto c = std::make_unique<Cluster>();
  torus::SliceIndex& index = c->index;
  int slices = hosts / 4;
  for (int s = 0; s < slices; ++s) {
    bool held = s < static_cast<int>(slices * held_fraction);
    for (int w = 0; w < 4; ++w) {
      torus::SliceHostInfo h;
      h.pod_type = "v6e-16";
      h.slice_name = "slice-" + std::to_string(100000 + s);
      h.topology = "4x4";
      h.worker_id = w;
      h.chips = 4;
      h.chips_free = !held;
      h.head_free = !held;
      c->node_ids.push_back("node-" + std::to_string(s * 4 + w));
      index.Upsert(c->node_ids.back(), h);
    }
  }
  return c;
}

void SetBusy(torus::SliceIndex& index, const torus::SliceIndex::Slice& s, bool busy) {
  for (int w = 0; w < 4; ++w) {
    torus::SliceHostInfo h;
    h.pod_type = s.pod_type;
    h.slice_name = s.name;
    h.topology = s.topology;
    h.worker_id = w;
    h.chips = 4;
    h.chips_free = !busy;
    h.head_free = !busy;
    index.Upsert(s.hosts[w], h);
  }
}

// Decide + grant + release, with a fraction of the slices already held by others.
void BM_SliceReservationDecision(benchmark::State& state) {
  int hosts = static_cast<int>(state.range(0));
  double held = state.range(1) / 100.0;
  auto cluster = MakeCluster(hosts, held);
  torus::SliceIndex& index = cluster->index;
  for (auto _ : state) {
    const auto* pick = index.FirstIdle("v6e-16", "", [](const torus::SliceIndex::Slice&) { return true; });
    if (!pick) {
      state.SkipWithError("no idle slice");
      break;
    }
    std::string name = pick->name;
    SetBusy(index, *pick, true);
    SetBusy(index, *index.Find(name), false);
  }
  state.counters["hosts"] = hosts;
  state.counters["slices"] = static_cast<double>(index.size());
}
BENCHMARK(BM_SliceReservationDecision)
    ->Args({1000, 0})->Args({10000, 0})->Args({10000, 50})->Args({10000, 99})
    ->Unit(benchmark::kMicrosecond);

// Building the index: one node registration each (what the head does per RegisterNode).
void BM_IndexBuild(benchmark::State& state) {
  for (auto _ : state) {
    auto cluster = MakeCluster(static_cast<int>(state.range(0)), 0);
    benchmark::DoNotOptimize(cluster->index.size());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_IndexBuild)->Arg(10000)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
