// Cold-start probe for bench/compare_ray, written against Ray's C++ API only (builds against
// Torus and against Ray's C++ package). Connects (or starts the embedded default when no
// address is set), runs one task, and prints one JSON line as soon as its result is back:
//   {"name": "first_task", "init_ms": 12.3, "first_task_ms": 4.5}
// The harness times from spawning this process to that line. With --hold S the process then
// stays connected and idle for S seconds (the harness samples memory meanwhile), prints
// {"name": "hold_done"} and shuts down.
#include <ray/api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

int ColdNoop() { return 1; }
RAY_REMOTE(ColdNoop);

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  double hold = 0;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--hold") hold = std::atof(argv[i + 1]);
  }
  auto t0 = Clock::now();
  ray::Init();
  auto t1 = Clock::now();
  int v = *ray::Get(ray::Task(ColdNoop).Remote());
  auto t2 = Clock::now();
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  printf("{\"name\": \"first_task\", \"init_ms\": %.3f, \"first_task_ms\": %.3f, \"value\": %d}\n",
         ms(t1 - t0), ms(t2 - t1), v);
  fflush(stdout);
  if (hold > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(hold));
    printf("{\"name\": \"hold_done\"}\n");
    fflush(stdout);
  }
  ray::Shutdown();
  return 0;
}
