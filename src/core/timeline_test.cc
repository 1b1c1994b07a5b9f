#include "core/timeline.h"

#include <gtest/gtest.h>

namespace torus::core {
namespace {

rpc::TaskInfo Task(const std::string& id, const std::string& node, const std::string& worker, int64_t start,
                   int64_t end, rpc::TaskInfo::State state = rpc::TaskInfo::FINISHED) {
  rpc::TaskInfo t;
  t.set_task_id(id);
  t.set_name("f" + id);
  t.set_node_id(node);
  t.set_worker_id(worker);
  t.set_start_us(start);
  t.set_end_us(end);
  t.set_state(state);
  return t;
}

TEST(TimelineTest, OneCompleteEventPerTaskOnItsWorkerRowInsideItsNode) {
  rpc::ListReply cluster;
  auto* n = cluster.add_nodes();
  n->set_node_id("node-aaaaaaaaaaaa");
  n->set_hostname("host-a");
  std::vector<rpc::TaskInfo> tasks = {
      Task("2", "node-bbbbbbbbbbbb", "w3", 300, 0, rpc::TaskInfo::RUNNING),
      Task("1", "node-aaaaaaaaaaaa", "w1", 100, 150),
      Task("3", "node-aaaaaaaaaaaa", "w2", 120, 180, rpc::TaskInfo::FAILED),
      Task("4", "node-aaaaaaaaaaaa", "w1", 200, 260),
      Task("5", "", "", 0, 0, rpc::TaskInfo::PENDING),  // never ran: left out
  };
  tasks[2].set_error("boom");
  tasks[3].set_actor_id("actor-1");
  auto ev = TimelineEvents(tasks, cluster, /*now_us=*/1000);
  std::map<int, std::string> procs;
  std::map<std::pair<int, int>, std::string> threads;
  std::vector<nlohmann::json> ran;
  for (const auto& e : ev) {
    if (e["ph"] == "M" && e["name"] == "process_name") procs[e["pid"]] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "thread_name") threads[{e["pid"], e["tid"]}] = e["args"]["name"];
    if (e["ph"] == "X") ran.push_back(e);
  }
  ASSERT_EQ(ran.size(), 4u);
  EXPECT_EQ(procs.size(), 2u);
  EXPECT_EQ(threads.size(), 3u);
  // Sorted by start; the node's row named with its host.
  EXPECT_EQ(ran[0]["name"], "f1");
  EXPECT_EQ(procs[ran[0]["pid"]], "Node node-aaaaaaa (host-a)");
  EXPECT_EQ(threads[std::make_pair(int(ran[0]["pid"]), int(ran[0]["tid"]))], "Worker w1");
  EXPECT_EQ(ran[0]["ts"], 100);
  EXPECT_EQ(ran[0]["dur"], 50);
  EXPECT_EQ(ran[0]["cat"], "task");
  // Same worker, same row; another worker of the node, another row of the same group.
  EXPECT_EQ(ran[2]["name"], "f4");
  EXPECT_EQ(ran[2]["tid"], ran[0]["tid"]);
  EXPECT_EQ(ran[2]["cat"], "actor_task");
  EXPECT_EQ(ran[1]["pid"], ran[0]["pid"]);
  EXPECT_NE(ran[1]["tid"], ran[0]["tid"]);
  EXPECT_EQ(ran[1]["cname"], "terrible");
  EXPECT_EQ(ran[1]["args"]["error"], "boom");
  // Still running: ends now; its node has no host name in the listing.
  EXPECT_EQ(ran[3]["dur"], 700);
  EXPECT_EQ(ran[3]["args"]["state"], "RUNNING");
  EXPECT_EQ(procs[ran[3]["pid"]], "Node node-bbbbbbb");
}

}  // namespace
}  // namespace torus::core
