#include "node/worker_pool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/ids.h"
#include "common/logging.h"
#include "tpu/chip_visibility.h"

extern char** environ;

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;
constexpr size_t kExitsKept = 10000;

// The environment of a worker process: the node's variables, its chips' visibility, its
// bundle's MEGASCALE_*, then the work's runtime_env variables (which never override the rest).
void SetWorkerEnv(const WorkerPoolConfig& cfg, const std::string& worker_id, const WorkerSpawn& spawn,
                  SpawnOptions* opts) {
  opts->env_set["TORUS_WORKER_MODE"] = "1";
  opts->env_set["TORUS_NODE_ADDRESS"] = cfg.node_address;
  opts->env_set["TORUS_BIND_HOST"] = cfg.bind_host;  // workers listen where their node does
  opts->env_set["TORUS_NODE_ID"] = cfg.node_id;
  opts->env_set["TORUS_WORKER_ID"] = worker_id;
  opts->env_set["TORUS_TOKEN"] = cfg.token;
  opts->env_set["TORUS_SESSION_DIR"] = cfg.session_dir;
  opts->env_set["TORUS_HEAD_ADDRESS"] = cfg.heads ? cfg.heads->joined() : "";
  opts->env_unset = {"TORUS_ADDRESS", "RAY_ADDRESS"};
  if (!spawn.command.empty()) {
    // A Python worker: the command it was started with, which it gives the Python work it
    // submits (core::PythonWorkerCommand), so nested work runs in the same interpreter and
    // import path and reuses the same pool of workers.
    opts->env_set["TORUS_PYTHON_WORKER_COMMAND"] = nlohmann::json(spawn.command).dump();
  }
  if (!spawn.chips.empty()) {
    // docs/tpu.md section 7: which chips this worker may use.
    std::map<std::string, std::string> env;
    for (char** e = environ; *e; ++e) {
      const char* eq = strchr(*e, '=');
      if (eq) env[std::string(*e, eq - *e)] = eq + 1;
    }
    auto changes = tpu::ComputeChipVisibility(cfg.num_chips, spawn.chips, tpu::VisibilityOptOut(env));
    for (const auto& [k, v] : changes.set) opts->env_set[k] = v;
    for (const auto& k : changes.unset) opts->env_unset.push_back(k);
  }
  if (!spawn.gpus.empty() && !std::getenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES")) {
    // The GPUs the work holds, as Ray gives them (ray.get_gpu_ids() reads them back).
    std::string ids;
    for (int g : spawn.gpus) ids += (ids.empty() ? "" : ",") + std::to_string(g);
    opts->env_set["CUDA_VISIBLE_DEVICES"] = ids;
  }
  if (spawn.bundle) {
    // A slice reservation's bundle: MEGASCALE_* always overwrite inherited values (section 7).
    for (const auto& [k, v] : spawn.bundle->env) opts->env_set[k] = v;
    for (const auto& k : spawn.bundle->env_unset) {
      opts->env_set.erase(k);
      opts->env_unset.push_back(k);
    }
  }
  if (spawn.env_vars) {
    // runtime_env env_vars (part of the key); the runtime's own variables above take precedence.
    for (const auto& [k, v] : *spawn.env_vars) opts->env_set.emplace(k, v);
  }
}
}  // namespace

std::string WorkerPool::ChipKey(const std::string& key, const std::vector<int>& chips) {
  if (chips.empty()) return key;
  std::string k = key + "|tpu=";
  for (int c : chips) k += std::to_string(c) + ",";
  return k;
}

std::string WorkerPool::HoldKey(const std::string& key, const Hold& h) {
  std::string k = ChipKey(key, h.chips);
  if (h.gpus.empty()) return k;
  k += "|gpu=";
  for (int g : Ledger::GpuIds(h)) k += std::to_string(g) + ",";
  return k;
}

StatusOr<Worker*> WorkerPool::Start(const std::string& key, const WorkerSpawn& spawn) {
  auto w = std::make_unique<Worker>();
  w->id = RandomHex(14);
  w->runtime_key = key;
  w->job_id = spawn.job_id;
  w->reserved_for = spawn.reserved_for;
  SpawnOptions opts;
  std::string code;
  for (const auto& p : spawn.code_path) code += (code.empty() ? "" : ":") + p;
  if (!spawn.command.empty()) {
    opts.argv = spawn.command;
  } else if (spawn.code_path.empty()) {
    opts.argv = {spawn.exe};
  } else {
    opts.argv = {cfg_.torus_exe, "worker"};
    opts.env_set["TORUS_CODE_SEARCH_PATH"] = code;
  }
  SetWorkerEnv(cfg_, w->id, spawn, &opts);
  std::string logs = cfg_.logs_dir.empty() ? cfg_.session_dir + "/logs" : cfg_.logs_dir;
  std::string log = logs + "/worker-" + w->id.substr(0, 12);
  opts.stdout_path = log + ".out";
  opts.stderr_path = log + ".err";
  auto pid = Spawn(opts);
  if (!pid.ok()) return pid.status();
  if (cfg_.log_files) {
    cfg_.log_files->Claim(opts.stdout_path, "worker", w->id);
    cfg_.log_files->Claim(opts.stderr_path, "worker", w->id);
  }
  w->pid = *pid;
  by_pid_[w->pid] = w->id;
  reaper_->Wake();
  if (spawn.reserved_for.empty()) starting_by_key_[key]++;
  TORUS_LOG(DEBUG) << "started worker " << w->id << " pid " << w->pid;
  Worker* out = w.get();
  workers_[w->id] = std::move(w);
  return out;
}

bool WorkerPool::Registered(const std::string& id, const std::string& address) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return false;
  Worker& w = *it->second;
  w.address = address;
  if (w.state == WorkerState::kStarting) {
    w.state = WorkerState::kIdle;
    w.idle_since = Clock::now();
    if (w.reserved_for.empty() && --starting_by_key_[w.runtime_key] <= 0) {
      starting_by_key_.erase(w.runtime_key);
    }
  }
  return true;
}

void WorkerPool::AddDriver(const std::string& id, pid_t pid, const std::string& address) {
  auto w = std::make_unique<Worker>();
  w->id = id;
  w->pid = pid;
  w->address = address;
  w->state = WorkerState::kDriver;
  workers_[id] = std::move(w);
}

Worker* WorkerPool::FindIdle(const std::string& key) {
  Worker* best = nullptr;
  for (auto& [id, w] : workers_) {
    if (w->state == WorkerState::kIdle && w->runtime_key == key && !w->kill_requested &&
        w->reserved_for.empty()) {
      if (!best || w->idle_since > best->idle_since) best = w.get();  // most recently used
    }
  }
  return best;
}

void WorkerPool::SetWarm(const std::string& key, const WorkerSpawn& spawn, int count) {
  count = std::min(count, kMaxWarmWorkers);
  if (count <= 0 || IsFinished(spawn.job_id)) {
    warm_.erase(key);
    return;
  }
  Warm& w = warm_[key];
  w.job_id = spawn.job_id;
  w.command = spawn.command;
  w.env_vars.clear();
  if (spawn.env_vars) w.env_vars.insert(spawn.env_vars->begin(), spawn.env_vars->end());
  w.count = count;
}

void WorkerPool::WarmTaken() { warm_taken_at_ = Clock::now(); }

Status WorkerPool::Refill() {
  Status first = Status::Ok();
  if (warm_.empty() || Clock::now() - warm_taken_at_ < kWarmRefillDelay) return first;
  for (const auto& [key, warm] : warm_) {
    // Workers leased to tasks come back: only those actors took are replaced.
    int have = Starting(key);
    for (const auto& [id, w] : workers_) {
      have += (w->state == WorkerState::kIdle || w->state == WorkerState::kLeased) &&
              w->runtime_key == key && !w->kill_requested && w->reserved_for.empty();
    }
    google::protobuf::Map<std::string, std::string> env(warm.env_vars.begin(), warm.env_vars.end());
    WorkerSpawn spawn;
    spawn.job_id = warm.job_id;
    spawn.command = warm.command;
    spawn.env_vars = &env;
    for (; have < warm.count; ++have) {
      auto started = Start(key, spawn);
      if (!started.ok()) {
        if (first.ok()) first = started.status();
        break;
      }
    }
  }
  return first;
}

Worker* WorkerPool::ClaimStarting(const std::string& key, const std::string& actor_id) {
  if (!warm_.count(key)) return nullptr;
  for (auto& [id, w] : workers_) {
    if (w->state == WorkerState::kStarting && w->runtime_key == key && w->reserved_for.empty() &&
        !w->kill_requested && w->pid > 0) {
      w->reserved_for = actor_id;
      if (--starting_by_key_[key] <= 0) starting_by_key_.erase(key);
      WarmTaken();  // its replacement waits, as for an idle one taken
      return w.get();
    }
  }
  return nullptr;
}

Worker* WorkerPool::Find(const std::string& id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : it->second.get();
}

int WorkerPool::Starting(const std::string& key) const {
  auto it = starting_by_key_.find(key);
  return it == starting_by_key_.end() ? 0 : it->second;
}

std::vector<pid_t> WorkerPool::PickIdleToStop(int keep, std::chrono::milliseconds keep_for) {
  std::vector<pid_t> out;
  // Up to each warm key's count of its idle workers stay (warm_ has no finished job's key).
  std::map<std::string, int> warm_left;
  for (const auto& [key, warm] : warm_) warm_left[key] = warm.count;
  std::set<const Worker*> warm;
  int idle = 0;
  for (auto& [id, w] : workers_) {
    if (w->state != WorkerState::kIdle) continue;
    auto it = warm_left.find(w->runtime_key);
    if (it != warm_left.end() && it->second > 0 && w->reserved_for.empty() && !w->kill_requested) {
      --it->second;
      warm.insert(w.get());
    } else {
      ++idle;
    }
  }
  if (!finished_.empty()) {
    for (auto& [id, w] : workers_) {
      if (w->state == WorkerState::kIdle && !w->kill_requested && finished_.count(w->job_id)) {
        w->kill_requested = true;
        out.push_back(w->pid);
        --idle;
      }
    }
  }
  auto now = Clock::now();
  for (auto& [id, w] : workers_) {
    if (idle <= keep) break;
    if (w->state == WorkerState::kIdle && !w->kill_requested && !warm.count(w.get()) &&
        now - w->idle_since > keep_for) {
      w->kill_requested = true;
      out.push_back(w->pid);
      --idle;
    }
  }
  return out;
}

void WorkerPool::JobFinished(const std::string& job_id) {
  if (!finished_.insert(job_id).second) return;
  for (auto it = warm_.begin(); it != warm_.end();) {
    it = it->second.job_id == job_id ? warm_.erase(it) : std::next(it);
  }
  finished_order_.push_back(job_id);
  if (finished_order_.size() > 1024) {
    finished_.erase(finished_order_.front());
    finished_order_.pop_front();
  }
}

std::vector<pid_t> WorkerPool::StopAll() {
  warm_.clear();  // nothing is started again
  std::vector<pid_t> out;
  for (auto& [id, w] : workers_) {
    if (w->pid > 0 && w->state != WorkerState::kDriver) {
      w->kill_requested = true;
      out.push_back(w->pid);
    }
  }
  return out;
}

std::vector<pid_t> WorkerPool::Pids() const {
  std::vector<pid_t> out;
  out.reserve(by_pid_.size());
  for (const auto& [pid, id] : by_pid_) out.push_back(pid);
  return out;
}

std::unique_ptr<Worker> WorkerPool::TakeExited(pid_t pid) {
  auto pit = by_pid_.find(pid);
  if (pit == by_pid_.end()) return nullptr;
  std::string id = pit->second;
  by_pid_.erase(pit);
  auto it = workers_.find(id);
  if (it == workers_.end()) return nullptr;
  std::unique_ptr<Worker> w = std::move(it->second);
  workers_.erase(it);
  if (w->state == WorkerState::kStarting && w->reserved_for.empty()) {
    if (--starting_by_key_[w->runtime_key] <= 0) starting_by_key_.erase(w->runtime_key);
  }
  if (w->state == WorkerState::kStarting && !w->kill_requested) {
    // A warm worker that died before registering (a broken command or import path): after
    // kMaxWarmFailures of them the key is not warmed any more, rather than restarted forever.
    auto warm = warm_.find(w->runtime_key);
    if (warm != warm_.end() && ++warm->second.failures >= kMaxWarmFailures) warm_.erase(warm);
  }
  return w;
}

void WorkerPool::RecordExit(const std::string& id, const std::string& description, int code) {
  exits_[id] = description;
  if (code != 0) exit_codes_[id] = code;
  exit_order_.push_back(id);
  while (exit_order_.size() > kExitsKept) {
    exit_codes_.erase(exit_order_.front());
    exits_.erase(exit_order_.front());
    exit_order_.pop_front();
  }
}

bool WorkerPool::LookupExit(const std::string& id, std::string* description, int* code) const {
  auto it = exits_.find(id);
  if (it == exits_.end()) return false;
  *description = it->second;
  auto c = exit_codes_.find(id);
  *code = c == exit_codes_.end() ? 0 : c->second;
  return true;
}

}  // namespace torus
