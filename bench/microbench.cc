// Core microbenchmarks, written against Ray's C++ API only, so the same source builds against
// Torus and against Ray's C++ package (bench/compare_ray). Row names follow Ray's
// microbenchmark. Prints one JSON object per row:
//   {"name": "single_client_tasks_sync", "value": 1234.5, "unit": "per_s", "n": 5000}
// Usage: microbench [--rows a,b,...] [--seconds S]   (connects via RAY_ADDRESS / TORUS_ADDRESS,
// or starts an embedded cluster when neither is set).
#include <ray/api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

int Noop() { return 0; }
RAY_REMOTE(Noop);

class Actor {
 public:
  static Actor* Create() { return new Actor(); }
  int Call() { return ++n_; }

 private:
  int n_ = 0;
};
RAY_REMOTE(Actor::Create, &Actor::Call);

namespace {
using Clock = std::chrono::steady_clock;
double g_seconds = 2.0;

// Runs `batch` repeatedly until g_seconds pass; returns units per second.
void Row(const std::string& name, const std::function<int64_t()>& batch, const char* unit = "per_s",
         double scale = 1.0) {
  batch();  // warm-up
  int64_t n = 0;
  auto start = Clock::now();
  double elapsed = 0;
  while (elapsed < g_seconds) {
    n += batch();
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  printf("{\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"n\": %lld}\n", name.c_str(),
         n / elapsed * scale, unit, static_cast<long long>(n));
  fflush(stdout);
}
}  // namespace

int main(int argc, char** argv) {
  ray::Init();
  std::set<std::string> rows;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rows" && i + 1 < argc) {
      std::stringstream ss(argv[++i]);
      std::string r;
      while (std::getline(ss, r, ',')) rows.insert(r);
    } else if (a == "--seconds" && i + 1 < argc) {
      g_seconds = std::atof(argv[++i]);
    }
  }
  auto want = [&](const std::string& r) { return rows.empty() || rows.count(r); };

  if (want("single_client_tasks_sync")) {
    Row("single_client_tasks_sync", [] {
      for (int i = 0; i < 100; ++i) ray::Get(ray::Task(Noop).Remote());
      return 100;
    });
  }
  if (want("single_client_tasks_async")) {
    Row("single_client_tasks_async", [] {
      std::vector<ray::ObjectRef<int>> refs;
      refs.reserve(1000);
      for (int i = 0; i < 1000; ++i) refs.push_back(ray::Task(Noop).Remote());
      ray::Get(refs);
      return 1000;
    });
  }
  if (want("1_1_actor_calls_sync") || want("1_1_actor_calls_async")) {
    auto a = ray::Actor(Actor::Create).Remote();
    ray::Get(a.Task(&Actor::Call).Remote());
    if (want("1_1_actor_calls_sync")) {
      Row("1_1_actor_calls_sync", [&] {
        for (int i = 0; i < 100; ++i) ray::Get(a.Task(&Actor::Call).Remote());
        return 100;
      });
    }
    if (want("1_1_actor_calls_async")) {
      Row("1_1_actor_calls_async", [&] {
        std::vector<ray::ObjectRef<int>> refs;
        refs.reserve(1000);
        for (int i = 0; i < 1000; ++i) refs.push_back(a.Task(&Actor::Call).Remote());
        ray::Get(refs);
        return 1000;
      });
    }
    a.Kill();
  }
  if (want("1_1_actor_calls_concurrent")) {
    auto a = ray::Actor(Actor::Create).SetMaxConcurrency(16).Remote();
    ray::Get(a.Task(&Actor::Call).Remote());
    Row("1_1_actor_calls_concurrent", [&] {
      std::vector<ray::ObjectRef<int>> refs;
      refs.reserve(1000);
      for (int i = 0; i < 1000; ++i) refs.push_back(a.Task(&Actor::Call).Remote());
      ray::Get(refs);
      return 1000;
    });
    a.Kill();
  }
  if (want("single_client_put_calls")) {
    Row("single_client_put_calls", [] {
      for (int i = 0; i < 1000; ++i) ray::Put(i);
      return 1000;
    });
  }
  if (want("single_client_get_calls")) {
    auto ref = ray::Put(42);
    Row("single_client_get_calls", [&] {
      for (int i = 0; i < 1000; ++i) ray::Get(ref);
      return 1000;
    });
  }
  if (want("single_client_put_gigabytes")) {
    std::vector<uint8_t> big(100 * 1024 * 1024, 7);  // 100 MiB per Put, as large as Ray's row
    Row(
        "single_client_put_gigabytes",
        [&] {
          for (int i = 0; i < 4; ++i) ray::Put(big);
          return static_cast<int64_t>(4 * big.size());
        },
        "GB_per_s", 1e-9);
  }
  if (want("single_client_wait_1k_refs")) {
    Row("single_client_wait_1k_refs", [] {
      std::vector<ray::ObjectRef<int>> refs;
      refs.reserve(1000);
      for (int i = 0; i < 1000; ++i) refs.push_back(ray::Task(Noop).Remote());
      ray::Wait(refs, 1000, -1);
      return 1;
    });
  }
  if (want("placement_group_create/removal")) {
    Row("placement_group_create/removal", [] {
      for (int i = 0; i < 20; ++i) {
        ray::PlacementGroupCreationOptions o;
        o.bundles = {{{"CPU", 0.01}}};
        o.strategy = ray::PlacementStrategy::PACK;
        auto pg = ray::CreatePlacementGroup(o);
        pg.Wait(60);
        ray::RemovePlacementGroup(pg.GetID());
      }
      return 20;
    });
  }
  ray::Shutdown();
  return 0;
}
