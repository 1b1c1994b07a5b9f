// Reserve one whole simulated v6e 4x4 TPU slice (4 hosts x 4 chips) atomically, run one worker per
// host with its slice identity and chips, and combine their partial results on the driver.
// Run by scripts/main_job.sh on a local cluster whose nodes carry the environment GKE gives TPU
// hosts (TPU_NAME, TPU_WORKER_ID, TPU_ACCELERATOR_TYPE, TPU_TOPOLOGY).
#include <ray/api.h>
#include <torus/tpu.h>

#include <cstdlib>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

struct HostResult {
  std::string slice;
  int worker_id = -1;
  std::string visible_chips;
  double partial = 0;
  MSGPACK_DEFINE(slice, worker_id, visible_chips, partial);
};

// Each host sums its shard of 1..n (a stand-in for the per-host compute of an SPMD program).
HostResult ShardSum(int64_t n, int hosts) {
  auto env = [](const char* k) {
    const char* v = std::getenv(k);
    return std::string(v ? v : "");
  };
  HostResult r;
  r.slice = env("TPU_NAME");
  r.worker_id = std::atoi(env("TPU_WORKER_ID").c_str());
  r.visible_chips = env("TPU_VISIBLE_CHIPS").empty() ? "all" : env("TPU_VISIBLE_CHIPS");
  int64_t per = n / hosts, lo = r.worker_id * per + 1, hi = (r.worker_id == hosts - 1) ? n : lo + per - 1;
  for (int64_t i = lo; i <= hi; ++i) r.partial += static_cast<double>(i);
  return r;
}
RAY_REMOTE(ShardSum);

int main() {
  ray::Init();
  std::cout << "intact v6e 4x4 slices: " << torus::tpu::GetNumIntactSlices("4x4", "v6e") << std::endl;
  torus::tpu::SliceOptions o;
  o.topology = "4x4";
  o.accelerator_version = "v6e";
  auto slice = torus::tpu::CreateSlicePlacementGroup(o);
  if (!slice.Wait(60)) {
    std::cerr << "no v6e 4x4 slice became free within 60 s" << std::endl;
    return 1;
  }
  std::cout << "reserved slice " << slice.SliceNames()[0] << " (" << slice.PodType() << ", "
            << slice.NumHosts() << " hosts x " << slice.ChipsPerHost() << " chips)" << std::endl;
  const int64_t n = 100000000;
  std::vector<ray::ObjectRef<HostResult>> parts;
  for (int i = 0; i < slice.NumBundles(); ++i) {
    parts.push_back(ray::Task(ShardSum)
                        .SetResources({{"TPU", static_cast<double>(slice.ChipsPerHost())}, {"CPU", 1}})
                        .SetPlacementGroup(slice.GetPlacementGroup(), i)
                        .Remote(n, slice.NumBundles()));
  }
  double total = 0;
  for (auto& p : ray::Get(parts)) {
    std::cout << "  host " << p->worker_id << " of " << p->slice << " (chips " << p->visible_chips
              << "): partial sum " << static_cast<int64_t>(p->partial) << std::endl;
    total += p->partial;
  }
  double expected = static_cast<double>(n) * (n + 1) / 2;
  std::cout << "all-reduce of 1.." << n << " = " << static_cast<int64_t>(total)
            << (total == expected ? " (correct)" : " (WRONG)") << std::endl;
  slice.Remove();
  ray::Shutdown();
  return total == expected ? 0 : 1;
}
