#include "node/job_runner.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/wall_clock.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/rpc.h"
#include "tpu/chip_visibility.h"

extern char** environ;

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;


std::map<std::string, std::string> OwnEnv() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = strchr(*e, '=');
    if (eq) env[std::string(*e, eq - *e)] = eq + 1;
  }
  return env;
}

// argv[0] as posix_spawn needs it: a name without '/' is looked up in PATH (as a shell would).
StatusOr<std::string> ResolveProgram(const std::string& prog, const std::string& path,
                                     const std::string& cwd) {
  if (prog.empty()) return InvalidArgument("empty command");
  if (prog.find('/') != std::string::npos) return prog;
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) dir = cwd.empty() ? "." : cwd;
    std::string cand = dir + "/" + prog;
    if (access(cand.c_str(), X_OK) == 0) return cand;
  }
  return NotFound("command '" + prog + "' not found in PATH");
}

}  // namespace

JobRunner::JobRunner(JobRunnerConfig cfg) : cfg_(std::move(cfg)) {
  reaper_ = std::thread([this] { ReapLoop(); });
}

JobRunner::~JobRunner() { Stop(); }

void JobRunner::SetSessionDir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  session_dir_ = dir;
}

void JobRunner::Stop() {
  std::vector<pid_t> pids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.exchange(true)) return;
    auto at = Clock::now() + std::chrono::milliseconds(1500);
    for (auto& [id, p] : procs_) {
      if (p.exited) continue;
      pids.push_back(p.pid);
      p.kill_at = std::min(p.kill_at, at);
    }
    cv_.notify_all();
    waiter_.Wake();
  }
  for (pid_t p : pids) kill(-p, SIGTERM);
  // The reaper SIGKILLs what is left at kill_at, reaps, and returns once nothing is live.
  if (reaper_.joinable()) reaper_.join();
}

grpc::Status JobRunner::StartProcess(grpc::ServerContext* ctx, const rpc::JobProcessSpec* req,
                                     rpc::JobProcessStartReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  if (req->argv_size() == 0) {
    SetError(reply->mutable_error(), InvalidArgument("a job process needs a command"));
    return grpc::Status::OK;
  }
  auto env = OwnEnv();
  SpawnOptions opts;
  for (const auto& a : req->argv()) opts.argv.push_back(a);
  for (const auto& k : req->env_unset()) opts.env_unset.push_back(k);
  if (req->whole_host_tpu() && cfg_.num_tpu_chips > 0) {
    // docs/tpu.md section 7, whole host granted.
    std::vector<int> all;
    for (int i = 0; i < cfg_.num_tpu_chips; ++i) all.push_back(i);
    auto c = tpu::ComputeChipVisibility(cfg_.num_tpu_chips, all, tpu::VisibilityOptOut(env));
    for (const auto& k : c.unset) opts.env_unset.push_back(k);
    for (const auto& [k, v] : c.set) opts.env_set[k] = v;
  }
  for (const auto& [k, v] : req->env_set()) opts.env_set[k] = v;
  opts.cwd = req->cwd();
  if (!opts.cwd.empty()) {
    struct stat st;
    if (stat(opts.cwd.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      SetError(reply->mutable_error(),
               InvalidArgument("working directory '" + opts.cwd + "' does not exist on node " +
                               cfg_.node_id));
      return grpc::Status::OK;
    }
  }
  std::string path = opts.env_set.count("PATH") ? opts.env_set["PATH"] : env["PATH"];
  auto prog = ResolveProgram(opts.argv[0], path, opts.cwd);
  if (!prog.ok()) {
    SetError(reply->mutable_error(), prog.status());
    return grpc::Status::OK;
  }
  opts.argv[0] = *prog;
  opts.new_session = true;  // its own process group: stop reaches its children too
  std::string id = req->job_id() + "-" + std::to_string(req->rank()) + "-" + RandomHex(4);
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dir = session_dir_.empty() ? std::filesystem::temp_directory_path().string() : session_dir_;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir + "/logs", ec);
  Proc p;
  p.job_id = req->job_id();
  p.output_path = dir + "/logs/job-" + id + ".out";
  opts.stdout_path = p.output_path;
  opts.stderr_path = p.output_path;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) {
    SetError(reply->mutable_error(), Unavailable("node " + cfg_.node_id + " is shutting down"));
    return grpc::Status::OK;
  }
  auto pid = Spawn(opts);
  if (!pid.ok()) {
    SetError(reply->mutable_error(), pid.status());
    return grpc::Status::OK;
  }
  p.pid = *pid;
  if (cfg_.log_files) cfg_.log_files->Claim(p.output_path, "job", "", req->job_id());
  procs_[id] = p;
  waiter_.Wake();
  cv_.notify_all();
  reply->set_process_id(id);
  reply->set_pid(*pid);
  reply->set_started_ms(WallClockMs());
  TORUS_LOG(INFO) << "job process " << id << " started, pid " << *pid;
  return grpc::Status::OK;
}

grpc::Status JobRunner::StopProcess(grpc::ServerContext* ctx, const rpc::JobProcessRef* req,
                                    rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  int64_t grace = req->grace_ms() > 0 ? req->grace_ms() : 3000;
  auto at = Clock::now() + std::chrono::milliseconds(grace);
  for (auto& [id, p] : procs_) {
    bool named = req->process_id().empty() ? (!req->job_id().empty() && p.job_id == req->job_id())
                                           : id == req->process_id();
    if (!named || p.exited) continue;
    kill(-p.pid, SIGTERM);
    p.kill_at = std::min(p.kill_at, at);
  }
  waiter_.Wake();  // the reaper's sleep ends at the earliest kill deadline
  return grpc::Status::OK;
}

grpc::Status JobRunner::TailProcess(grpc::ServerContext* ctx, const rpc::JobProcessTailRequest* req,
                                    grpc::ServerWriter<rpc::JobProcessOutput>* writer) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::string path;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = procs_.find(req->process_id());
    if (it == procs_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job process " + req->process_id());
    }
    path = it->second.output_path;
  }
  uint64_t offset = req->offset();
  std::vector<char> buf(64 * 1024);
  while (!ctx->IsCancelled()) {
    // Read the exit state before the file: output written before the exit is then all read.
    bool exited;
    rpc::JobProcessOutput last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const Proc& p = procs_[req->process_id()];
      exited = p.exited;
      last.set_description(p.description);
      last.set_exit_code(p.exit_code);
    }
    bool sent = false;
    std::ifstream f(path, std::ios::binary);
    if (f) {
      f.seekg(static_cast<std::streamoff>(offset));
      while (f) {
        f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        auto n = f.gcount();
        if (n <= 0) break;
        rpc::JobProcessOutput out;
        out.set_offset(offset);
        out.set_data(buf.data(), static_cast<size_t>(n));
        if (!writer->Write(out)) return grpc::Status::OK;
        offset += static_cast<uint64_t>(n);
        sent = true;
      }
    }
    if (exited) {
      last.set_exited(true);
      last.set_offset(offset);
      writer->Write(last);
      return grpc::Status::OK;
    }
    if (!sent) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(20));
      if (stopping_ && procs_[req->process_id()].exited) continue;
    }
  }
  return grpc::Status::OK;
}

grpc::Status JobRunner::PickPort(grpc::ServerContext* ctx, const rpc::Empty*, rpc::PickPortReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  for (int attempt = 0; attempt < 20; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = 0;
    inet_pton(AF_INET, cfg_.bind_host == "0.0.0.0" ? "0.0.0.0" : cfg_.bind_host.c_str(), &a.sin_addr);
    socklen_t len = sizeof a;
    int port = 0;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port = ntohs(a.sin_port);
    }
    close(fd);
    if (port > 0 && port != 8080 && port != 8081) {
      reply->set_host(cfg_.bind_host);
      reply->set_port(port);
      return grpc::Status::OK;
    }
  }
  SetError(reply->mutable_error(), Unavailable("no free port on node " + cfg_.node_id));
  return grpc::Status::OK;
}

void JobRunner::ReapLoop() {
  while (true) {
    std::vector<std::pair<std::string, pid_t>> live;
    auto next_kill = Clock::time_point::max();
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto now = Clock::now();
      for (auto& [id, p] : procs_) {
        if (p.exited) continue;
        live.emplace_back(id, p.pid);
        if (now >= p.kill_at) {
          kill(-p.pid, SIGKILL);
          p.kill_at = Clock::time_point::max();
        }
        next_kill = std::min(next_kill, p.kill_at);
      }
      if (stopping_ && live.empty()) return;
      if (live.empty()) {
        // Idle (the usual case, also for nodes embedded in drivers): sleep until a start or
        // Stop() (both notify cv_ under mu_).
        cv_.wait(lock);
        continue;
      }
    }
    bool any = false;
    for (const auto& [id, pid] : live) {
      int status = 0;
      pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == 0 || (r < 0 && errno != ECHILD)) continue;
      any = true;
      std::lock_guard<std::mutex> lock(mu_);
      Proc& p = procs_[id];
      p.exited = true;
      p.description = r == pid ? DescribeWaitStatus(status) : "ended (its exit status was lost)";
      p.exit_code = r == pid && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      // The group may have children left: they go with their leader.
      kill(-pid, SIGKILL);
      TORUS_LOG(INFO) << "job process " << id << " (pid " << pid << ") " << p.description;
      cv_.notify_all();
    }
    if (!any) {
      std::vector<pid_t> pids;
      for (const auto& [id, pid] : live) pids.push_back(pid);
      // Until one exits, a start or Stop() wakes the waiter, or the next kill deadline.
      auto wait = std::chrono::milliseconds(1000);
      if (next_kill != Clock::time_point::max()) {
        wait = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(next_kill - Clock::now()) +
                              std::chrono::milliseconds(1),
                          std::chrono::milliseconds(1), wait);
      }
      waiter_.Wait(pids, static_cast<int>(wait.count()));
    }
  }
}

}  // namespace torus
