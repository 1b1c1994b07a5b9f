// Submitted jobs (issue 5, docs/jobs.md): `torus job ...` against a real cluster of a head and one
// simulated v6e 4x4 slice (4 node processes with the TPU environment GKE gives each host).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <map>
#include <ray/api.h>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cluster_fixture.h"

using namespace torus_test;

namespace {

int JobPlus(int a, int b) { return a + b; }
RAY_REMOTE(JobPlus);

// The driver of a plain job: joins the cluster through the TORUS_ADDRESS its job got.
TORUS_TEST_CHILD_SCENARIO(job_driver) {
  if (!std::getenv("TORUS_ADDRESS")) return 10;
  ray::Init();
  int v = *ray::Get(ray::Task(JobPlus).Remote(40, 2), kGetTimeoutMs);
  std::cout << "driver result " << v << std::endl;
  ray::Shutdown();
  return 0;
}

std::string SelfExe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

NodeSpec Host(const std::string& slice, int worker) {
  NodeSpec s;
  s.num_cpus = 1;
  s.env = {{"TPU_NAME", slice},
           {"TPU_WORKER_ID", std::to_string(worker)},
           {"TPU_ACCELERATOR_TYPE", "v6e-16"},
           {"TPU_TOPOLOGY", "4x4"},
           {"TPU_WORKER_HOSTNAMES", slice + "-0," + slice + "-1," + slice + "-2," + slice + "-3"},
           {"TORUS_TPU_CHIPS", "4"},
           {"TORUS_TPU_METADATA_URL", "off"},
           {"MEGASCALE_NUM_SLICES", "3"}};  // stale: a single-slice job must not see it
  return s;
}

// A head (1 CPU) and one v6e 4x4 slice.
struct Jobs : ClusterTest<Jobs> {
  static constexpr const char* kName = "jobs";
  static constexpr bool kConnectDriver = false;
  static void Build(TestCluster& c) {
    c.StartHead(1);
    for (int w = 0; w < 4; ++w) c.AddNode(Host("job-slice", w));
  }

  RunResult Job(const std::vector<std::string>& args, double timeout_s = 120) {
    std::vector<std::string> a = {"job"};
    a.insert(a.end(), args.begin(), args.end());
    return cluster().Torus(a, {}, {}, timeout_s);
  }
  std::string SubmitNoWait(const std::vector<std::string>& args) {
    std::vector<std::string> a = {"submit", "--no-wait"};
    a.insert(a.end(), args.begin(), args.end());
    auto r = Job(a);
    EXPECT_EQ(r.exit_code, 0) << r.Describe();
    std::string id = r.out;
    while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
    return id;
  }
  nlohmann::json Status(const std::string& id) {
    auto r = Job({"status", id, "--format", "json"});
    if (r.exit_code != 0) return nlohmann::json::object();
    return nlohmann::json::parse(r.out);
  }
  std::string State(const std::string& id) {
    auto j = Status(id);
    return j.contains("state") ? j["state"].get<std::string>() : "";
  }
  std::string SliceState() {
    auto slices = cluster().ListJson("slices");
    for (const auto& s : slices) {
      if (s["slice_name"] == "job-slice") return s["state"].get<std::string>();
    }
    return "missing";
  }
};

std::vector<std::string> Lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string l;
  while (std::getline(ss, l)) out.push_back(l);
  return out;
}

TEST_F(Jobs, PlainJobStreamsOutputAndExitsWithItsStatus) {
  auto r = Job({"submit", "--", "bash", "-c", "echo to-out; echo to-err >&2; exit 7"});
  EXPECT_EQ(r.exit_code, 7) << r.Describe();
  EXPECT_NE(r.out.find("to-out\n"), std::string::npos) << r.Describe();
  EXPECT_NE(r.out.find("to-err\n"), std::string::npos) << r.Describe();
  EXPECT_NE(r.err.find("FAILED: the driver exited with status 7"), std::string::npos) << r.Describe();
  // The log stays available after the job.
  auto list = nlohmann::json::parse(Job({"list", "--format", "json"}).out);
  ASSERT_FALSE(list.empty());
  std::string id = list.back()["job_id"];
  EXPECT_EQ(list.back()["state"], "FAILED");
  EXPECT_EQ(list.back()["exit_code"], 7);
  EXPECT_EQ(Job({"logs", id}).out, "to-out\nto-err\n");
}

TEST_F(Jobs, PlainJobDriverJoinsTheClusterThroughTorusAddress) {
  auto r = Job({"submit", "--", "env", "TORUS_TEST_CHILD=job_driver", SelfExe()});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.out.find("driver result 42"), std::string::npos) << r.Describe();
}

TEST_F(Jobs, WorkingDirAndNoWait) {
  std::string dir = cluster().tmpdir();
  std::string id = SubmitNoWait({"--working-dir", dir, "--", "bash", "-c", "pwd; sleep 0.2"});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitUntil([&] { return State(id) == "SUCCEEDED"; }, std::chrono::seconds(30))) << State(id);
  EXPECT_EQ(Job({"logs", id}).out, dir + "\n");
}

TEST_F(Jobs, JobOutlivesTheSubmittingClient) {
  std::string out = cluster().tmpdir() + "/client.out";
  pid_t client = SpawnProcess({TORUS_BIN, "job", "submit", "--", "bash", "-c", "echo started; sleep 2; echo survived"},
                              {{"TORUS_TMPDIR", cluster().tmpdir()}}, {}, out, out);
  ASSERT_TRUE(WaitUntil([&] { return ReadFileOr(out).find("started") != std::string::npos; },
                        std::chrono::seconds(30)))
      << ReadFileOr(out);
  kill(client, SIGKILL);
  waitpid(client, nullptr, 0);
  auto list = nlohmann::json::parse(Job({"list", "--format", "json"}).out);
  ASSERT_FALSE(list.empty());
  std::string id = list.back()["job_id"];
  EXPECT_EQ(list.back()["state"], "RUNNING");
  ASSERT_TRUE(WaitUntil([&] { return State(id) == "SUCCEEDED"; }, std::chrono::seconds(30))) << State(id);
  EXPECT_EQ(Job({"logs", id}).out, "started\nsurvived\n");
}

TEST_F(Jobs, StopEndsTheDriver) {
  std::string id = SubmitNoWait({"--", "sleep", "60"});
  ASSERT_TRUE(WaitUntil([&] { return State(id) == "RUNNING"; }, std::chrono::seconds(30)));
  pid_t pid = Status(id)["processes"][0]["pid"].get<int>();
  EXPECT_TRUE(ProcessRunning(pid));
  auto r = Job({"stop", id});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.out.find("STOPPED"), std::string::npos) << r.Describe();
  EXPECT_EQ(State(id), "STOPPED");
  EXPECT_TRUE(WaitUntil([&] { return !ProcessRunning(pid); }, std::chrono::seconds(10)));
}

TEST_F(Jobs, GangJobRunsOneProcessPerHostOfTheSlice) {
  auto r = Job({"submit", "--slice", "4x4", "--accelerator", "v6e", "--", "bash", "-c",
                "echo env $TORUS_PROCESS_ID $TORUS_NUM_PROCESSES $TORUS_COORDINATOR_ADDRESS "
                "$TPU_NAME $TPU_WORKER_ID ${MEGASCALE_NUM_SLICES:-none} ${JAX_COORDINATOR_ADDRESS}"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  std::set<std::string> ranks, workers, coords;
  for (const auto& l : Lines(r.out)) {
    std::stringstream ss(l);
    std::string prefix, tag, rank, n, coord, name, worker, mega, jax;
    ss >> prefix >> tag >> rank >> n >> coord >> name >> worker >> mega >> jax;
    ASSERT_EQ(tag, "env") << l;
    EXPECT_EQ(prefix, "[job-slice/" + worker + "]") << l;  // output prefixed by host
    EXPECT_EQ(n, "4");
    EXPECT_EQ(name, "job-slice");
    EXPECT_EQ(mega, "none");  // single slice: inherited MEGASCALE_* removed
    EXPECT_EQ(jax, coord);
    EXPECT_EQ(rank, worker);  // one bundle per host: rank = worker id
    ranks.insert(rank);
    workers.insert(worker);
    coords.insert(coord);
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2", "3"})) << r.out;
  EXPECT_EQ(workers.size(), 4u);
  EXPECT_EQ(coords.size(), 1u) << r.out;
  auto list = nlohmann::json::parse(Job({"list", "--format", "json"}).out);
  auto job = list.back();
  std::set<std::string> nodes;
  for (const auto& p : job["processes"]) nodes.insert(p["node_id"].get<std::string>());
  EXPECT_EQ(nodes.size(), 4u);  // four distinct hosts
  EXPECT_EQ(job["slice_names"], nlohmann::json::array({"job-slice"}));
  EXPECT_TRUE(WaitUntil([&] { return SliceState() == "free"; }, std::chrono::seconds(10)));
}

TEST_F(Jobs, KilledGangProcessFailsTheJobStopsTheOthersAndFreesTheSlice) {
  std::string id = SubmitNoWait({"--slice", "4x4", "--accelerator", "v6e", "--", "sleep", "120"});
  ASSERT_TRUE(WaitUntil([&] { return State(id) == "RUNNING"; }, std::chrono::seconds(30))) << State(id);
  EXPECT_EQ(SliceState(), "reserved");
  auto procs = Status(id)["processes"];
  ASSERT_EQ(procs.size(), 4u);
  std::vector<pid_t> pids;
  for (const auto& p : procs) pids.push_back(p["pid"].get<int>());
  ASSERT_EQ(kill(pids[2], SIGKILL), 0);
  ASSERT_TRUE(WaitUntil([&] { return State(id) == "FAILED"; }, std::chrono::seconds(30))) << State(id);
  auto st = Status(id);
  EXPECT_NE(st["message"].get<std::string>().find("process 2 on host job-slice/2 killed by signal 9 (SIGKILL)"),
            std::string::npos)
      << st.dump();
  for (pid_t p : pids) EXPECT_TRUE(WaitUntil([&] { return !ProcessRunning(p); }, std::chrono::seconds(10))) << p;
  EXPECT_TRUE(WaitUntil([&] { return SliceState() == "free"; }, std::chrono::seconds(10))) << SliceState();
  // `torus job submit` waiting on such a job exits 1 with the message.
  auto r = Job({"submit", "--slice", "4x4", "--accelerator", "v6e", "--", "bash", "-c",
                "if [ $TORUS_PROCESS_ID = 1 ]; then kill -9 $$; fi; sleep 60"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("process 1 on host job-slice/1 killed by signal 9"), std::string::npos) << r.Describe();
}

TEST_F(Jobs, StopReleasesTheSlice) {
  std::string id = SubmitNoWait({"--slice", "4x4", "--accelerator", "v6e", "--", "sleep", "120"});
  ASSERT_TRUE(WaitUntil([&] { return State(id) == "RUNNING"; }, std::chrono::seconds(30))) << State(id);
  std::vector<pid_t> pids;
  for (const auto& p : Status(id)["processes"]) pids.push_back(p["pid"].get<int>());
  auto r = Job({"stop", id});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(State(id), "STOPPED");
  for (pid_t p : pids) EXPECT_FALSE(ProcessRunning(p)) << p;
  EXPECT_TRUE(WaitUntil([&] { return SliceState() == "free"; }, std::chrono::seconds(10))) << SliceState();
}

TEST_F(Jobs, MaxRetriesRerunsTheWholeGang) {
  // Rank 0 fails on the first attempt only; every process of every attempt leaves a mark.
  std::string dir = cluster().tmpdir() + "/retry";
  auto r = Job({"submit", "--max-retries", "2", "--slice", "4x4", "--accelerator", "v6e", "--", "bash", "-c",
                "mkdir -p " + dir + "; touch " + dir + "/run-$TORUS_PROCESS_ID-$$; "
                "if [ $TORUS_PROCESS_ID = 0 ] && [ ! -e " + dir + "/failed ]; then touch " + dir +
                "/failed; exit 5; fi; sleep 1; echo done"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.out.find("attempt 1 of job"), std::string::npos) << r.Describe();
  int runs = 0;
  for (const auto& l : Lines(r.out)) runs += l.find("] done") != std::string::npos;
  EXPECT_EQ(runs, 4) << r.out;
  auto list = nlohmann::json::parse(Job({"list", "--format", "json"}).out);
  EXPECT_EQ(list.back()["attempt"], 1);
  EXPECT_EQ(list.back()["state"], "SUCCEEDED");
  // Without retries left the job fails with the process' status.
  auto f = Job({"submit", "--max-retries", "1", "--", "bash", "-c", "exit 4"});
  EXPECT_EQ(f.exit_code, 4) << f.Describe();
  EXPECT_NE(f.out.find("attempt 1 of job"), std::string::npos) << f.Describe();
}

TEST_F(Jobs, BadRequestsAndFailedStartsAreReported) {
  // Invalid slice requests are refused at submit with the spec's message; nothing is recorded.
  auto bad = Job({"submit", "--slice", "4x16", "--accelerator", "v6e", "--", "true"});
  EXPECT_EQ(bad.exit_code, 1) << bad.Describe();
  EXPECT_NE(bad.err.find("Invalid accelerator topology: '4x16' for accelerator version: 'v6e'"),
            std::string::npos)
      << bad.Describe();
  auto half = Job({"submit", "--slice", "4x4", "--", "true"});
  EXPECT_EQ(half.exit_code, 1) << half.Describe();
  // A command that cannot start fails the job; for a gang, none of its processes runs and the
  // slice is released.
  auto missing = Job({"submit", "--", "no-such-command-for-torus"});
  EXPECT_EQ(missing.exit_code, 1) << missing.Describe();
  EXPECT_NE(missing.err.find("not found in PATH"), std::string::npos) << missing.Describe();
  auto gang = Job({"submit", "--working-dir", cluster().tmpdir() + "/absent", "--slice", "4x4", "--accelerator",
                   "v6e", "--", "true"});
  EXPECT_EQ(gang.exit_code, 1) << gang.Describe();
  EXPECT_NE(gang.err.find("could not start on job-slice/"), std::string::npos) << gang.Describe();
  EXPECT_NE(gang.err.find("does not exist"), std::string::npos) << gang.Describe();
  EXPECT_TRUE(WaitUntil([&] { return SliceState() == "free"; }, std::chrono::seconds(10))) << SliceState();
}

TEST_F(Jobs, JaxAllReduceOverTheSlice) {
  std::string repo = TORUS_SOURCE_DIR;
  auto venv = RunProcess({"/bin/bash", repo + "/scripts/jax_venv.sh"}, {}, {}, 600);
  if (venv.exit_code != 0) {
    GTEST_SKIP() << "cannot create the JAX venv (scripts/jax_venv.sh): " << venv.Describe();
  }
  std::string py = venv.out;
  while (!py.empty() && py.back() == '\n') py.pop_back();
  auto r = Job({"submit", "--slice", "4x4", "--accelerator", "v6e", "--", "env", "DEVICES_PER_PROCESS=2", py,
                repo + "/examples/jax_allreduce/allreduce.py"},
               300);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  int ok = 0;
  for (const auto& l : Lines(r.out)) ok += l.find("psum over 8 devices = 36 (expected 36) OK") != std::string::npos;
  EXPECT_EQ(ok, 4) << r.out;
}

}  // namespace
