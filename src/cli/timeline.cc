#include "cli/timeline.h"

#include <chrono>
#include <ctime>
#include <fstream>
#include <iostream>

#include "cli/cluster_connect.h"
#include "common/wall_clock.h"
#include "core/timeline.h"

namespace torus {

int Timeline(const Args& a) {
  if (!a.positional.empty()) Die("usage: torus timeline [--output FILE] [--address A]");
  Cluster c = Connect(a);
  const auto tasks = core::GatherTasks(c.list, c.token);
  const nlohmann::json events = core::TimelineEvents(tasks, c.list, WallClockUs());
  std::string out = a.Get("output");
  if (out.empty()) {
    char stamp[64];
    std::time_t t = std::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y-%m-%d_%H-%M-%S", std::localtime(&t));
    out = std::string("/tmp/torus-timeline-") + stamp + ".json";
  }
  if (out == "-") {
    std::cout << events.dump() << std::endl;
    return 0;
  }
  std::ofstream f(out);
  f << events.dump() << "\n";
  f.close();
  if (!f) Die("cannot write the timeline to " + out);
  size_t ran = 0;
  for (const auto& e : events) ran += e["ph"] == "X";
  std::cout << "Wrote " << ran << " task event(s) to " << out
            << "\nOpen it in https://ui.perfetto.dev or chrome://tracing." << std::endl;
  return 0;
}

}  // namespace torus
