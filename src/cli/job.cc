// `torus job`: a client of the head's Jobs service (docs/jobs.md). The job itself is supervised
// by the head; this process only submits, follows output and reports, so leaving it (Ctrl-C)
// leaves the job running.
//
//   torus job submit [--address A] [--working-dir DIR] [--no-wait] [--max-retries N]
//                    [--slice TOPOLOGY --accelerator VERSION [--num-slices N] [--timeout S]] -- CMD...
//   torus job status ID [--format json] | logs ID [--follow] | stop ID | list [--format json]
#include "cli/job.h"

#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cli/flags.h"
#include "common/json_limits.h"
#include "common/rpc.h"
#include "common/session.h"
#include "common/wire_states.h"
#include "proto/torus.grpc.pb.h"
#include "tpu/topology.h"

namespace torus {
namespace {

const char* kJobUsage =
    "usage: torus job submit [--address A] [--working-dir DIR] [--no-wait] [--max-retries N]\n"
    "                        [--slice TOPOLOGY --accelerator VERSION [--num-slices N] [--timeout SECONDS]]\n"
    "                        -- CMD [ARGS...]\n"
    "         --timeout: fail when the slices are not reserved within SECONDS (default: wait)\n"
    "       torus job status ID [--format json]\n"
    "       torus job logs ID [--follow]\n"
    "       torus job stop ID\n"
    "       torus job delete ID      (a finished job: its record and log)\n"
    "       torus job list [--format json]\n";

int IntFlag(const Args& a, const std::string& k, int def) {
  auto it = a.flags.find(k);
  if (it == a.flags.end()) return def;
  try {
    size_t used = 0;
    int v = std::stoi(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (...) {
  }
  Die("--" + k + " must be an integer, got '" + it->second + "'");
}

struct Conn {
  std::string address;
  std::string token;
  std::unique_ptr<rpc::Jobs::Stub> jobs;
};

Conn JobConnect(const Args& a) {
  Conn c;
  c.address = ResolveAddress(a);
  if (c.address.empty()) Die("no cluster: pass --address, set TORUS_ADDRESS, or run torus start --head");
  auto tok = FindToken();
  if (!tok.ok()) Die(tok.status().message());
  c.token = *tok;
  c.jobs = rpc::Jobs::NewStub(GetChannel(c.address));
  return c;
}

rpc::JobRecord Get(Conn& c, const std::string& id) {
  rpc::JobIdRequest req;
  req.set_job_id(id);
  rpc::JobReply reply;
  auto ctx = NewContext(c.token, 10000);
  auto st = c.jobs->GetJob(ctx.get(), req, &reply);
  if (!st.ok()) Die("cannot reach the head at " + c.address + ": " + st.error_message());
  if (reply.has_error() && reply.error().code() != 0) Die(reply.error().message());
  return reply.job();
}

// A job as JSON (docs/cli.md): the record's field names; times are numbers (protobuf's JSON
// mapping would print 64-bit integers as strings); states are their StateName text.
nlohmann::json ToJson(const rpc::JobRecord& r) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(r, &out, o);
  auto parsed = ParseJson(out, "job " + r.job_id() + " as JSON");
  if (!parsed.ok()) Die(parsed.status().message());
  nlohmann::json j = std::move(*parsed);
  j["submitted_ms"] = r.submitted_ms();
  j["end_ms"] = r.end_ms();
  j["state"] = StateName(r.state());
  for (int i = 0; i < r.processes_size(); ++i) {
    j["processes"][i]["started_ms"] = r.processes(i).started_ms();
    j["processes"][i]["state"] = StateName(r.processes(i).state());
  }
  return j;
}

// Exit code of `torus job submit` for a finished job: 0 when it succeeded, the failed process'
// exit status when it had one, else 1.
int ExitCodeOf(const rpc::JobRecord& r) {
  if (r.state() == rpc::JobRecord::SUCCEEDED) return 0;
  if (r.state() == rpc::JobRecord::FAILED && r.exit_code() > 0) return r.exit_code();
  return 1;
}

// Streams the job's log to stdout from `offset`; returns the final record when follow and the
// job ended (or the current one without follow).
rpc::JobRecord StreamLogs(Conn& c, const std::string& id, bool follow) {
  uint64_t offset = 0;
  int failures = 0;
  while (true) {
    rpc::JobLogsRequest req;
    req.set_job_id(id);
    req.set_offset(offset);
    req.set_follow(follow);
    auto ctx = NewContext(c.token);
    auto reader = c.jobs->JobLogs(ctx.get(), req);
    rpc::JobLogChunk chunk;
    while (reader->Read(&chunk)) {
      if (!chunk.data().empty() && chunk.offset() == offset) {
        std::cout.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
        std::cout.flush();
        offset += chunk.data().size();
        failures = 0;
      }
      if (chunk.done()) return chunk.job();
    }
    auto st = reader->Finish();
    if (st.error_code() == grpc::StatusCode::NOT_FOUND) Die(st.error_message());
    if (++failures > 20) Die("lost the head at " + c.address + ": " + st.error_message());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

// Says so on stderr when no slice of the job's shape exists in the cluster (broken or busy ones
// count as existing): the job would wait until one joins, which may be never.
void WarnIfNoSuchSlice(Conn& c, const rpc::JobSubmitRequest& job) {
  rpc::SliceQueryRequest q;
  q.set_topology(job.slice_topology());
  q.set_accelerator_version(job.accelerator_version());
  rpc::SliceQueryReply reply;
  auto ctx = NewContext(c.token, 5000);
  auto head = rpc::Head::NewStub(GetChannel(c.address));
  if (!head->QuerySlices(ctx.get(), q, &reply).ok() || reply.has_error()) return;
  auto shape = tpu::ComputeSliceShape(job.accelerator_version(), job.slice_topology(), std::nullopt);
  if (!shape.ok()) return;  // the head refused the job already
  std::string want = shape->pod_type + " (" + job.slice_topology() + ")";
  int same = 0;
  std::set<std::string> others;
  for (const auto& sl : reply.slices()) {
    if (sl.pod_type() == shape->pod_type) {
      ++same;
    } else {
      others.insert(sl.pod_type() + " (" + sl.topology() + ")");
    }
  }
  if (same > 0) return;
  std::string have;
  for (const auto& o : others) have += (have.empty() ? "" : ", ") + o;
  std::cerr << "torus: no " << want << " slice exists in this cluster"
            << (have.empty() ? std::string(" (it has no TPU slices)") : " (it has: " + have + ")")
            << "; the job waits until one joins"
            << (job.slice_wait_timeout_ms() > 0 ? std::string()
                                                : std::string(" (give --timeout S to bound the wait)"))
            << std::endl;
}

int Submit(const Args& a) {
  if (a.after_dashes.empty()) Die("job submit needs a command after --\n" + std::string(kJobUsage));
  Conn c = JobConnect(a);
  rpc::JobSubmitRequest req;
  for (const auto& s : a.after_dashes) req.add_entrypoint(s);
  std::string wd = a.flags.count("working-dir") ? a.flags.at("working-dir") : std::filesystem::current_path().string();
  std::error_code ec;
  auto abs = std::filesystem::absolute(wd, ec);
  req.set_working_dir(ec ? wd : abs.string());
  req.set_max_retries(IntFlag(a, "max-retries", 0));
  if (a.flags.count("slice")) req.set_slice_topology(a.flags.at("slice"));
  if (a.flags.count("accelerator")) req.set_accelerator_version(a.flags.at("accelerator"));
  if (a.flags.count("num-slices")) req.set_num_slices(IntFlag(a, "num-slices", 1));
  if (a.flags.count("timeout")) {
    int t = IntFlag(a, "timeout", 0);
    if (t <= 0) Die("--timeout must be a positive number of seconds, got '" + a.flags.at("timeout") + "'");
    if (!a.flags.count("slice")) Die("--timeout bounds the wait for --slice; give --slice and --accelerator");
    req.set_slice_wait_timeout_ms(int64_t{t} * 1000);
  }
  if (req.slice_topology().empty() != req.accelerator_version().empty()) {
    Die("--slice and --accelerator go together (e.g. --slice 4x4 --accelerator v6e)");
  }
  rpc::JobReply reply;
  auto ctx = NewContext(c.token, 10000);
  auto st = c.jobs->SubmitJob(ctx.get(), req, &reply);
  if (!st.ok()) Die("cannot reach the head at " + c.address + ": " + st.error_message());
  if (reply.has_error() && reply.error().code() != 0) Die(reply.error().message());
  std::string id = reply.job().job_id();
  if (a.flags.count("no-wait")) {
    std::cout << id << std::endl;
    return 0;
  }
  if (!req.slice_topology().empty()) WarnIfNoSuchSlice(c, req);
  std::cerr << "torus: job " << id << " submitted; its output follows (Ctrl-C leaves it running: "
            << "torus job logs " << id << " --follow, torus job stop " << id << ")" << std::endl;
  rpc::JobRecord r = StreamLogs(c, id, true);
  std::cerr << "torus: job " << id << " " << StateName(r.state())
            << (r.message().empty() ? "" : ": " + r.message()) << std::endl;
  return ExitCodeOf(r);
}

int JobStatus(const Args& a) {
  if (a.positional.size() < 2) Die("usage: torus job status ID [--format json]");
  Conn c = JobConnect(a);
  rpc::JobRecord r = Get(c, a.positional[1]);
  if (a.flags.count("format") && a.flags.at("format") == "json") {
    std::cout << ToJson(r).dump(2) << std::endl;
    return 0;
  }
  std::cout << r.job_id() << ": " << StateName(r.state())
            << (r.message().empty() ? "" : " (" + r.message() + ")") << "\n";
  if (r.attempt() > 0) std::cout << "  attempt " << r.attempt() + 1 << " of " << r.max_retries() + 1 << "\n";
  for (const auto& p : r.processes()) {
    std::cout << "  process " << p.rank() << " on " << p.host() << " (node " << p.node_id().substr(0, 12)
              << ", pid " << p.pid() << "): " << StateName(p.state())
              << (p.exit_description().empty() ? "" : ", " + p.exit_description()) << "\n";
  }
  return 0;
}

int JobStop(const Args& a) {
  if (a.positional.size() < 2) Die("usage: torus job stop ID");
  Conn c = JobConnect(a);
  rpc::JobIdRequest req;
  req.set_job_id(a.positional[1]);
  rpc::JobReply reply;
  auto ctx = NewContext(c.token, 10000);
  auto st = c.jobs->StopJob(ctx.get(), req, &reply);
  if (!st.ok()) Die("cannot reach the head at " + c.address + ": " + st.error_message());
  if (reply.has_error() && reply.error().code() != 0) Die(reply.error().message());
  // Processes get SIGTERM, then SIGKILL after 3 s; wait a little longer than that.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  rpc::JobRecord r = reply.job();
  while (!IsTerminal(r.state()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    r = Get(c, a.positional[1]);
  }
  std::cout << r.job_id() << ": " << StateName(r.state()) << std::endl;
  return IsTerminal(r.state()) ? 0 : 1;
}

int Delete(const Args& a) {
  if (a.positional.size() < 2) Die("usage: torus job delete ID");
  Conn c = JobConnect(a);
  rpc::JobIdRequest req;
  req.set_job_id(a.positional[1]);
  rpc::JobDeleteReply reply;
  auto ctx = NewContext(c.token, 10000);
  auto st = c.jobs->DeleteJob(ctx.get(), req, &reply);
  if (!st.ok()) Die("cannot reach the head at " + c.address + ": " + st.error_message());
  if (reply.has_error() && reply.error().code() != 0) Die(reply.error().message());
  std::cout << a.positional[1] << ": deleted" << std::endl;
  return 0;
}

int JobList(const Args& a) {
  Conn c = JobConnect(a);
  rpc::JobListReply reply;
  auto ctx = NewContext(c.token, 10000);
  auto st = c.jobs->ListJobs(ctx.get(), rpc::Empty(), &reply);
  if (!st.ok()) Die("cannot reach the head at " + c.address + ": " + st.error_message());
  if (a.flags.count("format") && a.flags.at("format") == "json") {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : reply.jobs()) out.push_back(ToJson(r));
    std::cout << out.dump(2) << std::endl;
    return 0;
  }
  if (reply.jobs().empty()) std::cout << "(no jobs)\n";
  for (const auto& r : reply.jobs()) {
    std::string cmd = r.shell_command();
    for (int i = 0; cmd.empty() && i < r.entrypoint_size(); ++i) cmd += (i ? " " : "") + r.entrypoint(i);
    std::cout << r.job_id() << "  " << StateName(r.state()) << "  "
              << (r.slice_topology().empty() ? "" : r.accelerator_version() + " " + r.slice_topology() + "  ")
              << cmd << "\n";
  }
  return 0;
}

}  // namespace

// The flags of each `torus job` subcommand; anything else is refused (cli/flags.h).
const std::map<std::string, std::vector<std::string>> kJobFlags = {
    {"submit", {"address", "working-dir", "no-wait", "max-retries", "slice", "accelerator", "num-slices",
                "timeout", "help"}},
    {"status", {"address", "format", "help"}},
    {"logs", {"address", "follow", "help"}},
    {"stop", {"address", "help"}},
    {"delete", {"address", "help"}},
    {"list", {"address", "format", "help"}},
};

int RunJobCommand(int argc, char** argv) {
  static const std::set<std::string> kBool = {"no-wait", "follow", "help"};
  Args a = ParseArgs(argc, argv, 2, kBool);
  std::string sub = a.positional.empty() ? "" : a.positional[0];
  auto known = kJobFlags.find(sub);
  RequireKnownFlags("job" + (sub.empty() ? "" : " " + sub), a.flags,
                    known == kJobFlags.end() ? std::vector<std::string>{"help"} : known->second);
  if (a.flags.count("help")) {
    std::cout << kJobUsage;
    return 0;
  }
  if (sub == "submit") return Submit(a);
  if (sub == "status") return JobStatus(a);
  if (sub == "logs") {
    if (a.positional.size() < 2) Die("usage: torus job logs ID [--follow]");
    Conn c = JobConnect(a);
    StreamLogs(c, a.positional[1], a.flags.count("follow") > 0);
    return 0;
  }
  if (sub == "stop") return JobStop(a);
  if (sub == "delete") return Delete(a);
  if (sub == "list") return JobList(a);
  if (!sub.empty()) std::cerr << "torus job: unknown subcommand '" << sub << "'\n";
  std::cerr << kJobUsage;
  return 2;
}

}  // namespace torus
