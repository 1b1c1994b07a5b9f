// Whole-slice reservation latency, one source for Torus and Ray (bench/compare_ray starts a head
// plus one node process per host of a simulated v6e 4x4 slice, each with the host's TPU
// environment and resources). Prints one JSON row like microbench:
//   {"name": "slice_reserve_release_v6e_4x4", "value": 812.0, "unit": "us", "n": 100, ...}
//
// Torus: torus::tpu::CreateSlicePlacementGroup (one atomic call), Wait, Remove.
// Ray (ray-cpp has no label selectors): Ray's own two-step path, as ray.util.tpu does it:
//   1. a placement group holding the slice's head unit ("TPU-v6e-16-head", worker 0 only),
//   2. a task in it that reads the host's TPU_NAME,
//   3. a STRICT_SPREAD group of one bundle per host, pinned to that slice by the per-slice
//      resource Ray's TPU accelerator manager advertises on every host (named after TPU_NAME),
//   then both groups removed. Reserve = 1-3 until the slice group is ready; release = removal.
//
// Usage: slice_compare [--iters N] [--hosts 4] [--chips-per-host 4]
#include <ray/api.h>

#if __has_include(<torus/tpu.h>)
#include <torus/tpu.h>
#define SLICE_COMPARE_TORUS 1
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

std::string SliceNameHere() {
  const char* v = std::getenv("TPU_NAME");
  return v ? v : "";
}
RAY_REMOTE(SliceNameHere);

namespace {
using Clock = std::chrono::steady_clock;

double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "slice_compare: %s\n", what.c_str());
  std::exit(1);
}
}  // namespace

int main(int argc, char** argv) {
  int iters = 100, hosts = 4, chips = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--iters") iters = std::atoi(argv[i + 1]);
    else if (a == "--hosts") hosts = std::atoi(argv[i + 1]);
    else if (a == "--chips-per-host") chips = std::atoi(argv[i + 1]);
  }
  const std::string pod = "v6e-" + std::to_string(hosts * chips);
  ray::Init();
  std::vector<double> total, reserve, release;
  std::vector<double> head_us, name_us;  // Ray's path: the head group, then the task reading TPU_NAME
  for (int it = 0; it < iters + 3; ++it) {
    auto t0 = Clock::now();
    Clock::time_point t1;
#ifdef SLICE_COMPARE_TORUS
    torus::tpu::SliceOptions o;
    o.topology = "4x4";
    o.accelerator_version = "v6e";
    auto slice = torus::tpu::CreateSlicePlacementGroup(o);
    if (!slice.Wait(60)) Die("slice not reserved in 60 s");
    t1 = Clock::now();
    slice.Remove();
#else
    ray::PlacementGroupCreationOptions head_opts;
    head_opts.bundles = {{{"TPU-" + pod + "-head", 1}, {"CPU", 0.1}}};
    head_opts.strategy = ray::PlacementStrategy::PACK;
    auto head = ray::CreatePlacementGroup(head_opts);
    if (!head.Wait(60)) Die("slice head not reserved in 60 s");
    auto th = Clock::now();
    std::string name = *ray::Task(SliceNameHere).SetPlacementGroup(head, 0).SetResource("CPU", 0.1).Remote().Get();
    auto tn = Clock::now();
    if (it >= 3) {
      head_us.push_back(Us(t0, th));
      name_us.push_back(Us(th, tn));
    }
    if (name.empty()) Die("TPU_NAME is not set on the slice's worker 0");
    ray::PlacementGroupCreationOptions slice_opts;
    for (int h = 0; h < hosts; ++h) slice_opts.bundles.push_back({{"TPU", chips}, {name, 1}});
    slice_opts.strategy = ray::PlacementStrategy::STRICT_SPREAD;
    auto slice = ray::CreatePlacementGroup(slice_opts);
    if (!slice.Wait(60)) Die("slice " + name + " not reserved in 60 s");
    t1 = Clock::now();
    ray::RemovePlacementGroup(slice.GetID());
    ray::RemovePlacementGroup(head.GetID());
#endif
    auto t2 = Clock::now();
    if (it < 3) continue;  // warm-up
    total.push_back(Us(t0, t2));
    reserve.push_back(Us(t0, t1));
    release.push_back(Us(t1, t2));
  }
  std::printf(
      "{\"name\": \"slice_reserve_release_v6e_4x4\", \"value\": %.1f, \"unit\": \"us\", \"n\": %d, "
      "\"reserve_us\": %.1f, \"release_us\": %.1f, \"ray_head_group_us\": %.1f, \"ray_name_task_us\": %.1f}\n",
      Median(total), iters, Median(reserve), Median(release), Median(head_us), Median(name_us));
  std::fflush(stdout);
  ray::Shutdown();
  return 0;
}
