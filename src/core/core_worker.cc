// First: gRPC's headers define some of the same names (absl's internal thread_annotations.h);
// until common/thread_annotations.h undefines them itself, it must come before them.
#include "common/thread_annotations.h"
#include "core/core_worker.h"

#include <cxxabi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <chrono>
#include <cstring>

#include "common/env_key.h"
#include "common/ids.h"
#include "common/labels.h"
#include "tpu/chip_visibility.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/lane.h"
#include "common/rpc.h"
#include "core/log_forwarder.h"
#include "common/work_queue.h"
#include "torus/api/exceptions.h"
#include "torus/api/runtime_env.h"
#include "torus/api/serializer.h"

namespace torus::core {

namespace {
using Clock = std::chrono::steady_clock;

constexpr auto kLeaseLinger = std::chrono::milliseconds(10);
constexpr int kMaxPipelineDepth = 64;
constexpr int kMaxLeaseRequestsInFlight = 2;

// Bytes owned by a shared string (small values).
class InlineBuffer final : public internal::Buffer {
 public:
  explicit InlineBuffer(std::shared_ptr<const std::string> s) : s_(std::move(s)) {}
  const char* data() const override { return s_->data(); }
  size_t size() const override { return s_->size(); }

 private:
  std::shared_ptr<const std::string> s_;
};

// A value inside the node's object-store arena, read in place. Keeps the arena mapped.
class ArenaBuffer final : public internal::Buffer {
 public:
  ArenaBuffer(std::shared_ptr<Mapping> arena, uint64_t offset, uint64_t size)
      : arena_(std::move(arena)), offset_(offset), size_(size) {}
  const char* data() const override { return arena_->data() + offset_; }
  size_t size() const override { return size_; }

 private:
  std::shared_ptr<Mapping> arena_;
  uint64_t offset_, size_;
};

// Task ids this process mints are NewObjectId()'s hex part: 16 hex of the worker id, then a
// 16-hex counter. The task table is keyed by that counter (no string key per task).
uint64_t TaskCounterOf(const std::string& task_id) {
  uint64_t v = 0;
  size_t start = task_id.size() >= 16 ? task_id.size() - 16 : 0;
  for (size_t i = start; i < task_id.size(); ++i) {
    char c = task_id[i];
    v = (v << 4) | static_cast<uint64_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
  }
  return v;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ------------------------------------------------------------------------------- internals

struct TaskRecordFields {
  int max_retries = 0;
  std::string key;                 // scheduling key (normal tasks)
  std::string actor_id;            // actor calls
  std::vector<std::string> deps;   // owned refs not yet ready
  std::vector<std::string> pinned; // refs pinned until the task ends
  std::vector<int> dep_arg_index;  // which args are deps
  int missing = 0;
  bool cancelled = false;          // Cancel(): fail as cancelled, never retry
  bool retry_exceptions = false;   // retry when the value is a Python exception value
  Conn* conn = nullptr;
  Clock::time_point sent_at;
};

// The spec lives on an arena whose first block is inside the record: building a spec (about
// ten strings and a map) costs no heap allocation per field, and dropping it none per field.
struct TaskRecord : TaskRecordFields {
  TaskRecord() : arena(Options(block)), spec(*google::protobuf::Arena::CreateMessage<rpc::TaskSpec>(&arena)) {}
  // A copy for a retry: the same fields, a fresh arena holding a copy of the spec.
  TaskRecord(const TaskRecord& o)
      : TaskRecordFields(o), arena(Options(block)),
        spec(*google::protobuf::Arena::CreateMessage<rpc::TaskSpec>(&arena)) {
    spec.CopyFrom(o.spec);
  }
  TaskRecord& operator=(const TaskRecord&) = delete;

  static google::protobuf::ArenaOptions Options(char* b) {
    google::protobuf::ArenaOptions o;
    o.initial_block = b;
    o.initial_block_size = kBlockSize;
    return o;
  }
  static constexpr size_t kBlockSize = 1024;
  alignas(16) char block[kBlockSize];
  google::protobuf::Arena arena;
  rpc::TaskSpec& spec;
};

struct SchedulingQueue {
  std::string key;
  rpc::LeaseRequest lease_template;
  std::deque<std::shared_ptr<TaskRecord>> tasks;
  std::vector<Conn*> leases;
  int lease_requests = 0;
  int lease_spread = 0;  // placement-group work on any bundle: which fitting bundle to ask next
};

struct ActorQueue {
  std::string actor_id;
  Conn* conn = nullptr;
  bool resolving = false;
  bool dead = false;
  std::string death_cause;
  int known_restarts = 0;
  uint64_t next_seq = 0;
  std::deque<std::shared_ptr<TaskRecord>> waiting;  // not sent yet, in submission order
};

// The PushTasks stream of a Conn: over the worker's lane (docs/wire.md) when it has one, else
// gRPC. A synchronous actor call is one message each way, and a gRPC stream message cost about
// twice the whole lane round trip here.
class TaskStream {
 public:
  virtual ~TaskStream() = default;
  virtual bool Write(const rpc::TaskBatch& b) = 0;
  virtual bool Read(rpc::ResultBatch* b) = 0;
  virtual void WritesDone() = 0;
  virtual grpc::Status Finish() = 0;
  virtual void Cancel() = 0;
};

class GrpcTaskStream final : public TaskStream {
 public:
  GrpcTaskStream(const std::string& address, const std::string& token) {
    ctx_.AddMetadata(kTokenMetadataKey, token);
    stub_ = rpc::CoreWorker::NewStub(GetChannel(address));
    stream_ = stub_->PushTasks(&ctx_);
  }
  bool Write(const rpc::TaskBatch& b) override { return stream_->Write(b); }
  bool Read(rpc::ResultBatch* b) override { return stream_->Read(b); }
  void WritesDone() override { stream_->WritesDone(); }
  grpc::Status Finish() override { return stream_->Finish(); }
  void Cancel() override { ctx_.TryCancel(); }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<rpc::CoreWorker::Stub> stub_;
  std::unique_ptr<grpc::ClientReaderWriter<rpc::TaskBatch, rpc::ResultBatch>> stream_;
};

class LaneTaskStream final : public TaskStream {
 public:
  explicit LaneTaskStream(std::unique_ptr<LaneClientStream> s) : s_(std::move(s)) {}
  bool Write(const rpc::TaskBatch& b) override { return s_->Write(b); }
  bool Read(rpc::ResultBatch* b) override { return s_->Read(b); }
  void WritesDone() override { s_->WritesDone(); }
  grpc::Status Finish() override { return s_->Finish(); }
  void Cancel() override { s_->Cancel(); }

 private:
  std::unique_ptr<LaneClientStream> s_;
};


// One outgoing PushTasks stream to a leased worker or an actor.
class Conn {
 public:
  Conn(CoreWorker* cw, std::string address, const std::string& token)
      : cw_(cw), address_(std::move(address)) {
    if (auto lane = LaneClientStream::Open(address_, token, kPushTasksMethod)) {
      stream_ = std::make_unique<LaneTaskStream>(std::move(lane));
    } else {
      stream_ = std::make_unique<GrpcTaskStream>(address_, token);
    }
    reader_ = std::thread([this] { ReadLoop(); });
    writer_ = std::thread([this] { WriteLoop(); });
  }
  ~Conn() { Join(); }

  // Writes right away from the caller's thread when the stream is idle (the common case for
  // synchronous calls: no thread hand-off); otherwise queues for the writer thread, which then
  // sends everything queued as one batch.
  // `direct` is the caller's hint that nothing else is in flight (a synchronous pattern); with
  // work in flight, queueing lets the writer batch.
  void Send(std::shared_ptr<TaskRecord> t, bool direct) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!direct || writing_ || !q_.empty() || closing_) {
      q_.push_back(std::move(t));
      cv_.notify_one();
      return;
    }
    writing_ = true;
    rpc::TaskBatch batch;
    if (!first_sent_) {
      batch.set_lease_id(lease_id_for_worker_);
      first_sent_ = true;
    }
    lock.unlock();
    std::shared_ptr<TaskRecord> one[1] = {std::move(t)};
    bool ok = WriteSpecs(batch, one, 1);
    lock.lock();
    writing_ = false;
    if (!ok) stream_->Cancel();
    // Only when the writer has something to do: waking it for nothing costs a thread switch
    // on every synchronous call.
    if (!q_.empty() || closing_) cv_.notify_one();
  }
  // Queues several tasks with one wake of the writer, so they go out as one batch.
  void SendAll(std::vector<std::shared_ptr<TaskRecord>> ts, bool direct) {
    if (ts.size() == 1) {
      Send(std::move(ts[0]), direct);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : ts) q_.push_back(std::move(t));
    cv_.notify_one();
  }
  // Half-close: no more sends; the reader ends when the worker finishes.
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    cv_.notify_one();
  }
  void Cancel() { stream_->Cancel(); }
  // Lets the worker give the lease back itself if this process dies mid-lease.
  void SetLease(const std::string& lease_id) {
    std::lock_guard<std::mutex> lock(mu_);
    lease_id_for_worker_ = lease_id;
  }
  void Join() {
    Close();
    if (writer_.joinable()) writer_.join();
    if (reader_.joinable()) reader_.join();
  }
  const std::string& address() const { return address_; }

  // Guarded by CoreWorker::mu_.
  std::string key, lease_id, worker_id, node_address, actor_id;
  std::unordered_map<uint64_t, std::shared_ptr<TaskRecord>> in_flight;  // by TaskCounterOf(task id)
  Clock::time_point idle_since = Clock::now();
  bool broken = false;
  bool returned = false;

 private:
  // Writes the specs as one TaskBatch without copying them: the batch borrows each record's
  // spec for the Write and gives it back. A spec is not modified once sent (a retry sends a copy).
  bool WriteSpecs(rpc::TaskBatch& batch, const std::shared_ptr<TaskRecord>* ts, size_t n) {
    auto* tasks = batch.mutable_tasks();
    tasks->Reserve(static_cast<int>(n));
    for (size_t i = 0; i < n; ++i) tasks->UnsafeArenaAddAllocated(&ts[i]->spec);
    bool ok = stream_->Write(batch);
    tasks->UnsafeArenaExtractSubrange(0, tasks->size(), nullptr);
    return ok;
  }

  void WriteLoop() {
    std::vector<std::shared_ptr<TaskRecord>> sending;
    while (true) {
      rpc::TaskBatch batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return (!q_.empty() || closing_) && !writing_; });
        if (q_.empty()) break;
        writing_ = true;
        if (!first_sent_) {
          batch.set_lease_id(lease_id_for_worker_);
          first_sent_ = true;
        }
        sending.assign(std::make_move_iterator(q_.begin()), std::make_move_iterator(q_.end()));
        q_.clear();
      }
      bool ok = WriteSpecs(batch, sending.data(), sending.size());
      sending.clear();
      {
        std::lock_guard<std::mutex> lock(mu_);
        writing_ = false;
      }
      if (!ok) {
        stream_->Cancel();
        return;
      }
    }
    stream_->WritesDone();
  }
  void ReadLoop() {
    rpc::ResultBatch batch;
    while (stream_->Read(&batch)) {
      cw_->OnResults(this, batch);
      batch.Clear();
    }
    auto st = stream_->Finish();
    cw_->OnConnBroken(this, st.ok() ? "stream closed" : st.error_message());
  }

  CoreWorker* cw_;
  std::string address_;
  std::unique_ptr<TaskStream> stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<TaskRecord>> q_;
  bool closing_ = false;
  bool writing_ = false;
  bool first_sent_ = false;
  std::string lease_id_for_worker_;
  std::thread reader_, writer_;
};

// ------------------------------------------------------------------------------- lifecycle

CoreWorker::CoreWorker(CoreWorkerOptions opts)
    : opts_(std::move(opts)),
      refs_(ReferenceCounter::Hooks{
          [this](ReferenceCounter::FreeRequest r) { FreeInStore(std::move(r)); },
          [this] { borrow_cv_.notify_all(); }}),
      rpc_work_(std::make_unique<WorkQueue>(4, 4096)) {}

StatusOr<std::unique_ptr<CoreWorker>> CoreWorker::Create(CoreWorkerOptions opts) {
  if (opts.worker_id.empty()) opts.worker_id = RandomHex(14);
  std::unique_ptr<CoreWorker> cw(new CoreWorker(std::move(opts)));
  if (auto s = cw->Connect(); !s.ok()) return s;
  return cw;
}

void CoreWorker::SetUpExecution() {
  python_command_ = PythonWorkerCommand(opts_.python_worker_command);
  python_runtime_key_ = CommandKey(python_command_);
  if (!opts_.is_driver) {
    std::unique_ptr<Executor> executor;
    if (opts_.make_executor) executor = opts_.make_executor();
    if (!executor) executor = std::make_unique<CppExecutor>(executable_);
    task_executor_ = std::make_unique<TaskExecutor>(static_cast<TaskExecutor::Host*>(this),
                                                    std::move(executor));
  }
}

Status CoreWorker::Connect() {
  executable_ = SelfExecutable();
  if (opts_.code_search_path.empty()) {
    runtime_key_ = "exe:" + executable_;
  } else {
    runtime_key_ = "code:";
    for (const auto& p : opts_.code_search_path) runtime_key_ += ":" + p;
  }
  SetUpExecution();
  int port = 0;
  std::vector<grpc::Service*> services = {this};
  if (task_executor_) {
    // Workers take their tasks over the lane too (drivers run none).
    lane_ = std::make_unique<LaneServer>(opts_.token, "worker " + opts_.worker_id);
    lane_->HandleStream(kPushTasksMethod, [this](LaneServerStream* s) {
      LaneTaskServerStream adapter{s};
      return task_executor_->ServeTasks(&adapter);
    });
    if (lane_->Start(opts_.bind_host) > 0) {
      services.push_back(lane_.get());
    } else {
      lane_.reset();
    }
  }
  server_ = StartServer(opts_.bind_host, &port, services);
  if (!server_ || port == 0) return Unavailable("cannot start the core worker's RPC server");
  address_ = opts_.bind_host + ":" + std::to_string(port);
  RegisterInProcessServer(address_, server_.get(), this);
  node_ = rpc::Node::NewStub(GetChannel(opts_.node_address));
  rpc::RegisterWorkerRequest req;
  req.set_worker_id(opts_.worker_id);
  req.set_address(address_);
  req.set_pid(getpid());
  req.set_is_driver(opts_.is_driver);
  rpc::RegisterWorkerReply reply;
  auto ctx = NewContext(opts_.token, 10000);
  auto st = node_->RegisterWorker(ctx.get(), req, &reply);
  if (!st.ok()) return FromGrpc(st, "cannot register with the node at " + opts_.node_address);
  node_id_ = reply.node_id();
  refs_.SetIdentity(address_, node_id_, opts_.node_address);
  shm_prefix_ = reply.shm_prefix();
  auto arena = OpenSegment(reply.arena_name(), /*writable=*/true);
  if (!arena.ok()) return arena.status();
  arena_ = std::shared_ptr<Mapping>(std::move(*arena));
  session_dir_ = reply.session_dir();
  if (opts_.head_address.empty()) opts_.head_address = reply.head_address();
  head_ = rpc::Head::NewStub(GetChannel(opts_.head_address));
  if (opts_.is_driver) {
    rpc::JobRequest job;
    job.set_job_id(opts_.job_id);
    job.set_driver_address(address_);
    job.set_pid(getpid());
    job.set_ray_namespace(opts_.ray_namespace);
    rpc::Empty e;
    auto jctx = NewContext(opts_.token, 10000);
    auto js = head_->RegisterJob(jctx.get(), job, &e);
    if (!js.ok()) return FromGrpc(js, "cannot register the job with the head at " + opts_.head_address);
    watch_ctx_ = NewContext(opts_.token);
    watch_thread_ = std::thread([this, job] {
      auto reader = head_->WatchJob(watch_ctx_.get(), job);
      rpc::Empty e;
      while (reader->Read(&e)) {
      }
      (void)reader->Finish();
    });
  }
  housekeeping_thread_ = std::thread([this] { HousekeepingLoop(); });
  borrow_thread_ = std::thread([this] { BorrowLoop(); });
  if (opts_.on_ready) opts_.on_ready(this);
  {
    std::lock_guard<std::mutex> lock(ready_mu_);
    ready_ = true;
  }
  ready_cv_.notify_all();
  return Status::Ok();
}

CoreWorker::~CoreWorker() { Shutdown(); }

void CoreWorker::Shutdown() {
  if (shutting_down_.exchange(true)) return;
  if (opts_.is_driver && head_) {
    rpc::JobRequest job;
    job.set_job_id(opts_.job_id);
    rpc::Empty e;
    auto ctx = NewContext(opts_.token, 5000);
    (void)head_->FinishJob(ctx.get(), job, &e);
  }
  if (watch_ctx_) watch_ctx_->TryCancel();
  if (watch_thread_.joinable()) watch_thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    borrow_cv_.notify_all();
  }
  if (borrow_thread_.joinable()) borrow_thread_.join();
  ReleaseAllBorrows(2000);
  std::vector<std::unique_ptr<Conn>> conns;
  std::vector<std::string> free_names;
  std::vector<std::pair<std::string, std::string>> leases;  // (node address, lease id)
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : conns_) {
      if (!c->lease_id.empty() && !c->returned) leases.emplace_back(c->node_address, c->lease_id);
      c->Cancel();
      conns.push_back(std::move(c));
    }
    conns_.clear();
    for (auto& d : dead_conns_) conns.push_back(std::move(d));
    dead_conns_.clear();
    free_names = refs_.Clear();
    cv_.notify_all();
  }
  for (auto& c : conns) c->Join();
  for (const auto& [addr, lease] : leases) {
    rpc::ReturnLeaseRequest req;
    req.set_lease_id(lease);
    rpc::Empty e;
    auto ctx = NewContext(opts_.token, 2000);
    (void)NodeStub(addr)->ReturnLease(ctx.get(), req, &e);
  }
  if (!free_names.empty()) {
    rpc::FreeObjectsRequest req;
    for (auto& n : free_names) req.add_keys(n);
    rpc::Empty e;
    auto ctx = NewContext(opts_.token, 2000);
    (void)node_->FreeObjects(ctx.get(), req, &e);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    hk_cv_.notify_all();
  }
  if (housekeeping_thread_.joinable()) housekeeping_thread_.join();
  // End helper threads: cancel their blocking RPCs, then wait for them.
  std::list<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> tracked;
  {
    std::lock_guard<std::mutex> lock(track_mu_);
    for (auto* c : live_ctx_) c->TryCancel();
    tracked.swap(tracked_);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  for (auto& [t, done] : tracked) t.join();
  rpc_work_->Stop();  // runs the frees and lease returns still queued
  if (log_forwarder_) log_forwarder_->Stop();
  UnregisterInProcessServer(address_);
  // A stream still running a task keeps its lane thread: then the lane outlives us (leaked on
  // purpose; the process is ending).
  if (lane_ && !lane_->Stop(std::chrono::milliseconds(200))) (void)lane_.release();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
}

namespace {
std::atomic<bool>* g_term_flag = nullptr;
void OnSigterm(int) {
  if (g_term_flag) *g_term_flag = true;
}
}  // namespace

void CoreWorker::RunWorkerLoop() {
  pid_t parent = getppid();
  // A SIGTERM (the node stopping surplus idle workers) is honoured once this worker owns
  // nothing that another process still refers to: the objects it owns die with it. An actor
  // worker, or a node that is stopping (it SIGKILLs after a grace period), ends it anyway.
  g_term_flag = &term_requested_;
  struct sigaction sa{};
  sa.sa_handler = OnSigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  bool told_deferral = false;
  while (!exit_requested_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (int64_t at = task_executor_->exit_at_ms(); at != 0 && NowMs() >= at) {  // ExitActor()
      fflush(stdout);
      fflush(stderr);
      _exit(0);
    }
    if (getppid() != parent) {
      TORUS_LOG(WARNING) << "node process went away; worker exiting";
      break;
    }
    if (term_requested_) {
      bool owns;
      {
        std::lock_guard<std::mutex> lock(mu_);
        owns = task_executor_->actor_id().empty() && refs_.OwnsLiveObjects();
      }
      if (!owns) {
        ReleaseAllBorrows(1000);
        signal(SIGTERM, SIG_DFL);
        raise(SIGTERM);
      }
      if (!told_deferral) {
        TORUS_LOG(INFO) << "SIGTERM received; exiting once the objects this worker owns are released";
        told_deferral = true;
      }
    }
  }
  ReleaseAllBorrows(1000);
  fflush(stdout);
  fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let forwarded output go out
  _exit(0);
}

void CoreWorker::SpawnTracked(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(track_mu_);
  if (shutting_down_) return;
  for (auto it = tracked_.begin(); it != tracked_.end();) {
    if (*it->second) {
      it->first.join();
      it = tracked_.erase(it);
    } else {
      ++it;
    }
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  tracked_.emplace_back(std::thread([fn = std::move(fn), done] {
                          fn();
                          *done = true;
                        }),
                        done);
}

std::unique_ptr<grpc::ClientContext> CoreWorker::TrackedContext(int64_t deadline_ms) {
  auto ctx = NewContext(opts_.token, deadline_ms);
  std::lock_guard<std::mutex> lock(track_mu_);
  if (shutting_down_) ctx->TryCancel();
  live_ctx_.insert(ctx.get());
  return ctx;
}

void CoreWorker::ReleaseContext(grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> lock(track_mu_);
  live_ctx_.erase(ctx);
}

std::unique_ptr<rpc::Node::Stub> CoreWorker::NodeStub(const std::string& address) {
  return rpc::Node::NewStub(GetChannel(address));
}

void CoreWorker::HousekeepingLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutting_down_) {
    std::vector<Conn*> to_return;
    auto wake_at = CollectIdleLeases(&to_return);
    std::vector<std::unique_ptr<Conn>> to_join = std::move(dead_conns_);
    dead_conns_.clear();
    if (to_return.empty() && to_join.empty()) {
      // Nothing to do before the next lease's linger ends: sleep until then, or until
      // WakeHousekeeping() (a lease went idle, a connection broke) or Shutdown().
      hk_wakes_at_ = wake_at;
      if (wake_at == Clock::time_point::max()) {
        hk_cv_.wait(lock);
      } else {
        hk_cv_.wait_until(lock, wake_at);
      }
      hk_wakes_at_ = Clock::time_point::min();
      continue;
    }
    lock.unlock();
    for (Conn* c : to_return) {
      c->Close();
      ReturnLease(c, false);
    }
    to_join.clear();  // joins reader/writer threads outside the lock
    lock.lock();
  }
}

Clock::time_point CoreWorker::CollectIdleLeases(std::vector<Conn*>* to_return) {
  auto now = Clock::now();
  auto wake_at = Clock::time_point::max();
  for (auto& c : conns_) {
    if (c->broken || c->returned || !c->actor_id.empty() || !c->in_flight.empty()) continue;
    auto qit = queues_.find(c->key);
    bool queue_empty = qit == queues_.end() || qit->second->tasks.empty();
    if (!queue_empty) continue;
    if (now - c->idle_since <= kLeaseLinger) {
      wake_at = std::min(wake_at, c->idle_since + kLeaseLinger + std::chrono::microseconds(100));
      continue;
    }
    c->returned = true;
    if (qit != queues_.end()) {
      auto& ls = qit->second->leases;
      ls.erase(std::remove(ls.begin(), ls.end(), c.get()), ls.end());
    }
    to_return->push_back(c.get());
  }
  return wake_at;
}

void CoreWorker::WakeHousekeeping() {
  // A wake-up time already set comes no later than a lease going idle now would need.
  if (hk_wakes_at_ == Clock::time_point::max()) hk_cv_.notify_one();
}

// ------------------------------------------------------------------------------- objects

std::string CoreWorker::NewObjectId() {
  // opts_.worker_id[0, 16) + Hex64(counter) + "@" + address_, built with one allocation.
  static const char* kDigits = "0123456789abcdef";
  uint64_t v = ++next_object_;
  std::string id;
  id.reserve(33 + address_.size());
  id.append(opts_.worker_id, 0, 16);
  char hex[16];
  for (int i = 15; i >= 0; --i, v >>= 4) hex[i] = kDigits[v & 0xf];
  id.append(hex, 16);
  id += '@';
  id += address_;
  return id;
}

std::string CoreWorker::Put(std::string bytes) { return PutBytes(std::move(bytes), {}); }

std::string CoreWorker::PutBytes(std::string bytes, std::vector<std::string> nested) {
  if (bytes.size() >= kInlineLimit) {
    // Large: through the store (PutWith collects no refs from a memcpy: add the given ones).
    std::string id =
        PutWith(bytes.size(), [&](char* dst) { internal::CopyLarge(dst, bytes.data(), bytes.size()); },
                /*may_hold_refs=*/false);
    if (!nested.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& n : nested) refs_.Entry(n).local_refs++;
      auto it = refs_.objects().find(id);
      if (it != refs_.objects().end()) it->second.L().nested = std::move(nested);
    }
    return id;
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::string id = NewObjectId();
  ObjectEntry& e = refs_.Entry(id);
  e.owned = true;
  e.ready = true;
  e.local_refs = 1;
  e.inline_data = std::make_shared<const std::string>(std::move(bytes));
  // The value keeps the objects it refers to alive (one local reference each).
  for (const auto& n : nested) refs_.Entry(n).local_refs++;
  if (!nested.empty()) e.L().nested = std::move(nested);
  return id;
}

std::string CoreWorker::PutWith(size_t size, const std::function<void(char*)>& fill,
                                bool may_hold_refs) {
  internal::RefCollector refs;
  if (size < kInlineLimit) {
    std::string bytes(size, '\0');
    if (may_hold_refs) {
      internal::CollectRefs scope(&refs);
      fill(bytes.data());
    } else {
      fill(bytes.data());
    }
    return PutBytes(std::move(bytes), std::move(refs.ids));
  }
  std::string id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = NewObjectId();
  }
  auto loc = CreateInStore(id, id, size, address_);
  if (!loc.ok()) throw internal::RayException("Put failed: " + loc.status().message());
  if (may_hold_refs) {
    internal::CollectRefs scope(&refs);
    fill(arena_->data() + loc->offset());
  } else {
    fill(arena_->data() + loc->offset());
  }
  std::lock_guard<std::mutex> lock(mu_);
  ObjectEntry& en = refs_.Entry(id);
  en.owned = true;
  en.ready = true;
  en.local_refs = 1;
  en.in_shm = true;
  en.shm = *loc;
  for (const auto& n : refs.ids) refs_.Entry(n).local_refs++;
  if (!refs.ids.empty()) en.L().nested = std::move(refs.ids);
  return id;
}

void CoreWorker::AddLocalReference(const std::string& id) {
  std::unique_lock<std::mutex> lock(mu_);
  ObjectEntry& e = refs_.Entry(id);
  e.local_refs++;
  if (e.owned || e.borrow_regs > 0) return;
  if (e.registering) {
    // Another thread is registering this process: the reference is good once it is done.
    cv_.wait(lock, [&] {
      auto it = refs_.objects().find(id);
      return it == refs_.objects().end() || !it->second.registering || shutting_down_;
    });
    return;
  }
  // A reference to an object someone else owns: register with the owner as a borrower before
  // relying on it (whoever handed it over holds it until then), so the owner keeps it for as
  // long as this process does.
  std::string owner = OwnerOf(id);
  if (owner.empty() || owner == address_ || shutting_down_) return;
  e.registering = true;
  lock.unlock();
  std::set<std::string> unknown;
  auto st = CallBorrow(owner, address_, 1, {id}, &unknown, 10000);
  lock.lock();
  cv_.notify_all();
  bool registered = st.ok() && unknown.empty();
  if (!st.ok()) {
    TORUS_LOG(WARNING) << "cannot register as a borrower of object " << id << " with its owner: "
                       << st.error_message();
  }
  // This reference holds the entry and MaybeFree skips registering entries; only Shutdown
  // (clearing every entry) can have removed it.
  auto it = refs_.objects().find(id);
  if (it == refs_.objects().end()) {
    if (registered) refs_.QueueBorrowRelease(id, 1);
    return;
  }
  it->second.registering = false;
  if (registered) it->second.borrow_regs++;
  if (it->second.local_refs <= 0 && it->second.pins <= 0) refs_.MaybeFreeAt(it);
}

void CoreWorker::RemoveLocalReference(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  refs_.RemoveLocal(id);
}

void CoreWorker::FreeInStore(ReferenceCounter::FreeRequest r) {
  // Free outside the caller's critical path: a fire-and-forget RPC on the pool.
  rpc_work_->Post([r = std::move(r), token = opts_.token] {
    rpc::FreeObjectsRequest req;
    for (auto& n : r.keys) req.add_keys(n);
    rpc::Empty e;
    auto ctx = NewContext(token, 5000);
    (void)rpc::Node::NewStub(GetChannel(r.node_address))->FreeObjects(ctx.get(), req, &e);
  });
}

void CoreWorker::StoreResult(const std::string& id, rpc::TaskResult& r) {
  auto it = refs_.objects().find(id);
  if (it == refs_.objects().end()) {
    refs_.AdoptNested(nullptr, {r.nested_ids().begin(), r.nested_ids().end()});  // give the registrations made for us back
    // Nobody holds a reference any more: drop the value (and its segment).
    if (!r.is_error() && r.value().in_shm()) {
      FreeInStore({r.value().node_address(), {r.value().key()}});
    }
    return;
  }
  ObjectEntry& e = it->second;
  e.ready = true;
  if (e.waited) {
    e.waited = false;
    cv_.notify_all();
  }
  if (r.is_error()) {
    e.is_error = true;
    e.error = r.error();
  } else if (r.value().in_shm()) {
    e.in_shm = true;
    e.shm = r.value();
  } else {
    e.inline_data =
        std::make_shared<const std::string>(std::move(*r.mutable_value()->mutable_inline_data()));
  }
  if (r.nested_ids_size() > 0) {
    refs_.AdoptNested(e.ready && !e.is_error ? &e : nullptr,
                      {r.nested_ids().begin(), r.nested_ids().end()});
  }
  OnObjectReady(id);
}

void CoreWorker::FailObject(const std::string& id, StatusCode code, const std::string& msg) {
  rpc::TaskResult r;
  r.set_is_error(true);
  SetError(r.mutable_error(), code, msg);
  StoreResult(id, r);
}

bool CoreWorker::LocationOf(const std::string& id, rpc::ObjectLocation* loc, bool* is_error,
                            rpc::Error* err) {
  auto it = refs_.objects().find(id);
  if (it == refs_.objects().end() || !it->second.ready) return false;
  const ObjectEntry& e = it->second;
  *is_error = e.is_error;
  if (e.is_error) {
    *err = e.error;
  } else if (e.in_shm) {
    *loc = e.shm;
  } else {
    loc->set_inline_data(*e.inline_data);
  }
  return true;
}

void CoreWorker::EnsureFetching(const std::string& id) {
  ObjectEntry& e = refs_.Entry(id);
  if (e.ready || e.fetching || e.owned) return;
  e.fetching = true;
  SpawnTracked([this, id] { FetchFromOwner(id); });
}

void CoreWorker::FetchFromOwner(const std::string& id) {
  std::string owner = OwnerOf(id);
  rpc::GetObjectReply reply;
  grpc::Status st;
  if (owner.empty()) {
    st = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed object id '" + id + "'");
  } else {
    auto stub = rpc::CoreWorker::NewStub(GetChannel(owner));
    rpc::GetObjectRequest req;
    req.set_object_id(id);
    req.set_timeout_ms(-1);
    auto ctx = TrackedContext();
    st = stub->GetObject(ctx.get(), req, &reply);
    ReleaseContext(ctx.get());
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = refs_.objects().find(id);
  if (it == refs_.objects().end()) return;
  it->second.fetching = false;
  rpc::TaskResult r;
  if (!st.ok()) {
    r.set_is_error(true);
    SetError(r.mutable_error(), StatusCode::kUnavailable,
             "the owner of object " + id + " is unreachable (" + st.error_message() +
                 "); the object is lost");
  } else if (reply.is_error()) {
    r.set_is_error(true);
    *r.mutable_error() = reply.error();
  } else {
    *r.mutable_value() = reply.value();
  }
  StoreResult(id, r);  // may insert entries: `it` is stale after this
  refs_.ReleaseIfUnused(id);
}

StatusOr<rpc::ObjectLocation> CoreWorker::CreateInStore(const std::string& object_id,
                                                       const std::string& key, uint64_t size,
                                                       const std::string& owner) {
  rpc::CreateObjectRequest req;
  req.set_object_id(object_id);
  req.set_key(key);
  req.set_size(size);
  req.set_owner_address(owner);
  rpc::CreateObjectReply reply;
  auto ctx = NewContext(opts_.token, 10000);
  auto st = node_->CreateObject(ctx.get(), req, &reply);
  if (!st.ok()) return FromGrpc(st, "the node refused to store object " + object_id);
  if (reply.has_error() && reply.error().code() != 0) {
    return Status(static_cast<StatusCode>(reply.error().code()), reply.error().message());
  }
  if (reply.offset() + size > arena_->size()) return Internal("node returned an offset out of range");
  rpc::ObjectLocation loc = StoreLocation(key, node_id_, opts_.node_address);
  loc.set_offset(reply.offset());
  loc.set_size(size);
  return loc;
}

StatusOr<std::shared_ptr<internal::Buffer>> CoreWorker::Materialize(const rpc::ObjectLocation& loc,
                                                                    const std::string& object_id) {
  if (!loc.in_shm()) {
    return std::shared_ptr<internal::Buffer>(
        std::make_shared<InlineBuffer>(std::make_shared<const std::string>(loc.inline_data())));
  }
  if (loc.node_id() == node_id_) {
    if (loc.offset() + loc.size() > arena_->size()) {
      return Internal("object " + object_id + " lies outside the arena");
    }
    return std::shared_ptr<internal::Buffer>(
        std::make_shared<ArenaBuffer>(arena_, loc.offset(), loc.size()));
  }
  {
    // Already pulled to this node by this process?
    std::lock_guard<std::mutex> lock(mu_);
    auto it = refs_.objects().find(object_id);
    if (it != refs_.objects().end() && it->second.has_local_copy) {
      const auto& c = it->second.local_copy;
      return std::shared_ptr<internal::Buffer>(
          std::make_shared<ArenaBuffer>(arena_, c.offset(), c.size()));
    }
  }
  // Pull from the node that holds it, in chunks, into this node's store.
  auto local = CreateInStore(object_id, HexOf(object_id) + ".copy." + RandomHex(4), loc.size(),
                             OwnerOf(object_id));
  if (!local.ok()) return local.status();
  auto free_local = [&] {
    rpc::FreeObjectsRequest req;
    req.add_keys(local->key());
    rpc::Empty e;
    auto ctx = NewContext(opts_.token, 5000);
    (void)node_->FreeObjects(ctx.get(), req, &e);
  };
  auto stub = NodeStub(loc.node_address());
  rpc::FetchObjectRequest req;
  req.set_key(loc.key());
  req.set_chunk_size(4 << 20);
  auto ctx = NewContext(opts_.token);
  auto reader = stub->FetchObject(ctx.get(), req);
  rpc::ObjectChunk chunk;
  uint64_t got = 0;
  char* dst = arena_->data() + local->offset();
  while (reader->Read(&chunk)) {
    if (chunk.offset() + chunk.data().size() > loc.size()) break;
    memcpy(dst + chunk.offset(), chunk.data().data(), chunk.data().size());
    got += chunk.data().size();
  }
  auto st = reader->Finish();
  if (!st.ok() || got != loc.size()) {
    free_local();
    return Status(StatusCode::kUnavailable, "cannot pull object " + object_id + " from node " +
                                                loc.node_address() + ": " +
                                                (st.ok() ? "short read" : st.error_message()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = refs_.objects().find(object_id);
    if (it != refs_.objects().end() && !it->second.has_local_copy) {
      it->second.has_local_copy = true;
      it->second.local_copy = *local;
      return std::shared_ptr<internal::Buffer>(
          std::make_shared<ArenaBuffer>(arena_, local->offset(), local->size()));
    }
  }
  // Nobody left to remember the copy: hand back an owned copy of the bytes and free the slot.
  auto bytes = std::make_shared<const std::string>(dst, loc.size());
  free_local();
  return std::shared_ptr<internal::Buffer>(std::make_shared<InlineBuffer>(bytes));
}

void CoreWorker::ThrowIfError(const std::string& id, const ObjectEntry& e) {
  if (!e.is_error) return;
  auto code = static_cast<StatusCode>(e.error.code());
  const std::string& msg = e.error.message();
  switch (code) {
    case StatusCode::kTaskError: throw internal::RayTaskException(msg);
    case StatusCode::kActorDied: throw internal::RayActorException(msg);
    case StatusCode::kWorkerDied: throw internal::RayWorkerException(msg);
    case StatusCode::kNotFound: throw internal::RayFunctionNotFound(msg);
    case StatusCode::kSliceLost: throw internal::RaySliceLostException(msg);
    case StatusCode::kCancelled: throw internal::TaskCancelledException(msg);
    default: throw internal::UnreconstructableException(msg);
  }
}

void CoreWorker::SetBlocked(bool blocked) {
  if (opts_.is_driver) return;
  rpc::BlockedRequest req;
  req.set_worker_id(opts_.worker_id);
  req.set_blocked(blocked);
  rpc::Empty e;
  auto ctx = NewContext(opts_.token, 5000);
  (void)node_->NotifyBlocked(ctx.get(), req, &e);
}

// Which of a Get's ids are ready: ids[0, cursor) were when last looked at. A wait sleeps until
// the first id that is not ready is stored (StoreResult wakes the waiters of entries marked
// `waited`), so a Get of many refs neither wakes on every result nor rescans every id each
// time. Once the cursor reaches the end, one full pass confirms that all are ready; it also
// records each entry for the reads after it (no lookups then: mu_ is held from it to them).
struct CoreWorker::ReadyScan {
  ReadyScan(ReferenceCounter& r, const std::vector<std::string>& i)
      : refs(r), ids(i), entries(i.size()) {}
  bool AllReady() {
    for (bool verified = false;; verified = true) {
      for (; cursor < ids.size(); ++cursor) {
        ObjectEntry* e = refs.Find(ids[cursor]);
        if (!e || !e->ready) {
          if (e) e->waited = true;
          return false;
        }
        entries[cursor] = e;
      }
      if (verified) return true;
      cursor = 0;
    }
  }
  ReferenceCounter& refs;
  const std::vector<std::string>& ids;
  size_t cursor = 0;
  std::vector<ObjectEntry*> entries;
};

namespace {
// A store view that holds a local reference to its object until it goes.
class PinnedBuffer final : public internal::Buffer {
 public:
  PinnedBuffer(std::shared_ptr<internal::Buffer> view, std::string id)
      : view_(std::move(view)), id_(std::move(id)) {}
  ~PinnedBuffer() override {
    if (internal::Runtime* rt = internal::GetRuntime()) {
      try {
        rt->RemoveLocalReference(id_);
      } catch (const std::exception&) {  // a destructor must not throw
      }
    }
  }
  const char* data() const override { return view_->data(); }
  size_t size() const override { return view_->size(); }

 private:
  std::shared_ptr<internal::Buffer> view_;
  std::string id_;
};
}  // namespace

std::vector<std::shared_ptr<internal::Buffer>> CoreWorker::Get(const std::vector<std::string>& ids,
                                                               int timeout_ms) {
  auto deadline = timeout_ms < 0 ? Clock::time_point::max()
                                 : Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::vector<std::shared_ptr<internal::Buffer>> out(ids.size());
  std::vector<std::pair<size_t, rpc::ObjectLocation>> to_map;
  std::vector<size_t> local;  // values in this node's store, read in place
  // A worker blocked in Get tells its node (which may then start another worker); it is
  // unblocked when this goes, after mu_ is released.
  struct Blocked {
    CoreWorker* cw;
    bool on = false;
    ~Blocked() {
      if (on) cw->SetBlocked(false);
    }
  } blocked{this};
  {
    std::unique_lock<std::mutex> lock(mu_);
    StartFetches(ids);
    ReadyScan scan(refs_, ids);
    if (!scan.AllReady()) {
      if (!opts_.is_driver) {
        lock.unlock();
        SetBlocked(true);
        blocked.on = true;
        lock.lock();
      }
      WaitAllReady(lock, scan, deadline, timeout_ms);
    }
    ReadValues(scan, &out, &to_map);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (scan.entries[i]->in_shm && scan.entries[i]->shm.node_id() == node_id_) local.push_back(i);
    }
  }
  // A view of the store pins its object (one local reference) for as long as the view lives,
  // so memory a reader still looks at is never freed and reused (zero-copy numpy arrays
  // outlive their ObjectRef).
  for (size_t i : local) {
    AddLocalReference(ids[i]);
    out[i] = std::make_shared<PinnedBuffer>(std::move(out[i]), ids[i]);
  }
  for (auto& [i, loc] : to_map) {
    auto b = Materialize(loc, ids[i]);
    if (!b.ok()) throw internal::UnreconstructableException(b.status().message());
    AddLocalReference(ids[i]);
    out[i] = std::make_shared<PinnedBuffer>(std::move(*b), ids[i]);
  }
  return out;
}

void CoreWorker::StartFetches(const std::vector<std::string>& ids) {
  for (const auto& id : ids) {
    ObjectEntry* e = refs_.Find(id);
    if (!e) {
      if (OwnerOf(id) == address_) {
        throw internal::UnreconstructableException("object " + id +
                                                   " was freed: no ObjectRef to it was held");
      }
      refs_.Entry(id);  // a temporary borrowed entry; erased below if nobody refers to it
      EnsureFetching(id);
    } else if (!e->ready && !e->fetching && !e->owned) {
      EnsureFetching(id);
    }
  }
}

void CoreWorker::WaitAllReady(std::unique_lock<std::mutex>& lock, ReadyScan& scan,
                              Clock::time_point deadline, int timeout_ms) {
  while (!scan.AllReady()) {
    if (shutting_down_) throw internal::RayException("ray::Shutdown() was called during Get");
    if (deadline == Clock::time_point::max()) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !scan.AllReady()) {
      lock.unlock();
      throw internal::RayTimeoutException("Get timed out: some object(s) not ready after " +
                                          std::to_string(timeout_ms) + " ms");
    }
  }
}

void CoreWorker::ReadValues(ReadyScan& scan, std::vector<std::shared_ptr<internal::Buffer>>* out,
                            std::vector<std::pair<size_t, rpc::ObjectLocation>>* to_map) {
  const auto& ids = scan.ids;
  bool any_borrowed = false;
  try {
    for (size_t i = 0; i < ids.size(); ++i) {
      ObjectEntry& e = *scan.entries[i];
      any_borrowed |= !e.owned;
      ThrowIfError(ids[i], e);
      if (e.in_shm && e.shm.node_id() == node_id_) {
        (*out)[i] = std::make_shared<ArenaBuffer>(arena_, e.shm.offset(), e.shm.size());
      } else if (e.in_shm) {
        to_map->emplace_back(i, e.shm);
      } else {
        (*out)[i] = std::make_shared<InlineBuffer>(e.inline_data);
      }
    }
  } catch (...) {
    for (const auto& id : ids) refs_.ReleaseIfUnused(id);
    throw;
  }
  // Temporary borrowed entries of inline values: the buffers hold the bytes now.
  for (size_t i = 0; any_borrowed && i < ids.size(); ++i) {
    auto it = refs_.objects().find(ids[i]);
    if (it != refs_.objects().end() && !it->second.in_shm && it->second.Unused() &&
        !it->second.owned) {
      refs_.MaybeFreeAt(it);
    }
  }
}

std::vector<bool> CoreWorker::Wait(const std::vector<std::string>& ids, int num_objects,
                                   int timeout_ms) {
  if (num_objects < 0 || num_objects > static_cast<int>(ids.size())) {
    throw internal::RayException("Wait: num_objects (" + std::to_string(num_objects) +
                                 ") must be between 0 and the number of refs (" +
                                 std::to_string(ids.size()) + ")");
  }
  auto deadline = timeout_ms < 0 ? Clock::time_point::max()
                                 : Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::vector<bool> ready(ids.size(), false);
  std::unique_lock<std::mutex> lock(mu_);
  for (const auto& id : ids) {
    if (!refs_.objects().count(id) && OwnerOf(id) != address_) refs_.Entry(id);
    if (refs_.objects().count(id)) EnsureFetching(id);
  }
  while (true) {
    int n = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = refs_.objects().find(ids[i]);
      ready[i] = it == refs_.objects().end() ? OwnerOf(ids[i]) == address_ : it->second.ready;
      n += ready[i];
    }
    if (n >= num_objects || shutting_down_) break;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ready[i]) continue;
      auto it = refs_.objects().find(ids[i]);
      if (it != refs_.objects().end()) it->second.waited = true;
    }
    if (deadline == Clock::time_point::max()) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      for (size_t i = 0; i < ids.size(); ++i) {
        auto it = refs_.objects().find(ids[i]);
        ready[i] = it != refs_.objects().end() && it->second.ready;
      }
      break;
    }
  }
  return ready;
}

grpc::Status CoreWorker::GetObject(grpc::ServerContext* ctx, const rpc::GetObjectRequest* req,
                                   rpc::GetObjectReply* reply) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  {
    std::unique_lock<std::mutex> lock(ready_mu_);
    ready_cv_.wait(lock, [this] { return ready_; });
  }
  auto deadline = req->timeout_ms() < 0 ? Clock::time_point::max()
                                        : Clock::now() + std::chrono::milliseconds(req->timeout_ms());
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto it = refs_.objects().find(req->object_id());
    if (it == refs_.objects().end() || !it->second.owned) {
      reply->set_ready(true);
      reply->set_is_error(true);
      SetError(reply->mutable_error(), StatusCode::kUnavailable,
               "object " + req->object_id() + " is unknown to its owner (already freed)");
      return grpc::Status::OK;
    }
    bool is_error = false;
    if (LocationOf(req->object_id(), reply->mutable_value(), &is_error, reply->mutable_error())) {
      reply->set_ready(true);
      reply->set_is_error(is_error);
      return grpc::Status::OK;
    }
    if (ctx->IsCancelled() || shutting_down_ || Clock::now() >= deadline) return grpc::Status::OK;
    it->second.waited = true;
    cv_.wait_for(lock, std::chrono::milliseconds(100));
  }
}

// ------------------------------------------------------------------------------- borrowing

grpc::Status CoreWorker::CallBorrow(const std::string& owner, const std::string& borrower,
                                    int delta, const std::vector<std::string>& ids,
                                    std::set<std::string>* unknown, int deadline_ms,
                                    bool cancellable) {
  rpc::BorrowObjectsRequest req;
  req.set_borrower(borrower);
  req.set_delta(delta);
  for (const auto& id : ids) req.add_object_ids(id);
  rpc::BorrowObjectsReply reply;
  auto ctx = cancellable ? TrackedContext(deadline_ms) : NewContext(opts_.token, deadline_ms);
  auto st = rpc::CoreWorker::NewStub(GetChannel(owner))->BorrowObjects(ctx.get(), req, &reply);
  if (cancellable) ReleaseContext(ctx.get());
  if (unknown) unknown->insert(reply.unknown().begin(), reply.unknown().end());
  return st;
}

grpc::Status CoreWorker::BorrowObjects(grpc::ServerContext* ctx, const rpc::BorrowObjectsRequest* req,
                                       rpc::BorrowObjectsReply* reply) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  if (req->object_ids_size() == 0) return grpc::Status::OK;  // a liveness probe
  if (req->borrower().empty() || req->delta() == 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "BorrowObjects needs a borrower and a delta");
  }
  std::vector<std::string> ids(req->object_ids().begin(), req->object_ids().end()), unknown;
  {
    std::lock_guard<std::mutex> lock(mu_);
    refs_.BorrowObjects(req->borrower(), req->delta(), ids, &unknown);
  }
  for (auto& id : unknown) reply->add_unknown(std::move(id));
  return grpc::Status::OK;
}

void CoreWorker::RegisterResultBorrows(const std::string& submitter, std::vector<std::string> ids,
                                       rpc::TaskResult* result) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::map<std::string, std::vector<std::string>> by_owner;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& id : ids) {
      std::string owner = OwnerOf(id);
      if (owner.empty()) continue;
      if (owner != address_) {
        by_owner[owner].push_back(std::move(id));
        continue;
      }
      // Ours: register the submitter here.
      auto it = refs_.objects().find(id);
      if (it == refs_.objects().end() || !it->second.owned) continue;
      refs_.AdjustBorrower(it->second, submitter, 1);
      result->add_nested_ids(id);
    }
  }
  for (auto& [owner, owned] : by_owner) {
    std::set<std::string> unknown;
    auto st = CallBorrow(owner, submitter, 1, owned, &unknown, 10000);
    if (!st.ok()) {
      TORUS_LOG(WARNING) << "cannot register the caller as a borrower of " << owned.size()
                         << " object(s) with their owner " << owner << ": " << st.error_message();
      continue;  // the caller will find them lost
    }
    for (const auto& id : owned) {
      if (!unknown.count(id)) result->add_nested_ids(id);
    }
  }
}

std::vector<std::string> CoreWorker::PinArgBorrows(const rpc::TaskSpec& spec) {
  std::vector<std::string> pinned;
  bool any = false;
  for (const auto& a : spec.args()) any |= a.nested_ids_size() > 0;
  if (!any) return pinned;
  std::map<std::string, std::vector<std::string>> to_register;  // owner -> ids
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& a : spec.args()) {
      for (const std::string& id : a.nested_ids()) {
        ObjectEntry& e = refs_.Entry(id);
        e.pins++;
        pinned.push_back(id);
        if (e.owned || e.borrow_regs > 0 || e.registering) continue;
        std::string owner = OwnerOf(id);
        if (owner.empty() || owner == address_) continue;
        e.registering = true;
        to_register[owner].push_back(id);
      }
    }
  }
  for (auto& [owner, ids] : to_register) {
    std::set<std::string> unknown;
    auto st = CallBorrow(owner, address_, 1, ids, &unknown, 10000);
    if (!st.ok()) {
      TORUS_LOG(WARNING) << "cannot register as a borrower of " << ids.size()
                         << " object(s) with their owner " << owner << ": " << st.error_message();
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& id : ids) {
      auto it = refs_.objects().find(id);
      if (it == refs_.objects().end()) {  // only Shutdown clears pinned entries
        if (st.ok() && !unknown.count(id)) refs_.QueueBorrowRelease(id, 1);
        continue;
      }
      it->second.registering = false;
      if (st.ok() && !unknown.count(id)) it->second.borrow_regs++;
    }
    cv_.notify_all();
  }
  return pinned;
}

void CoreWorker::UnpinArgBorrows(const std::vector<std::string>& pinned) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& id : pinned) {
    refs_.Unpin(id);
  }
}

void CoreWorker::BorrowLoop() {
  auto next_probe = Clock::now() + std::chrono::seconds(1);
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      borrow_cv_.wait_until(lock, next_probe, [this] {
        return shutting_down_ || refs_.HasPendingReleases();
      });
      if (shutting_down_) return;
    }
    FlushBorrowReleases(5000, /*cancellable=*/true);
    if (Clock::now() >= next_probe) {
      ProbeBorrowers();
      next_probe = Clock::now() + std::chrono::seconds(1);
    }
  }
}

void CoreWorker::FlushBorrowReleases(int deadline_ms, bool cancellable) {
  ReferenceCounter::Releases pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending = refs_.TakePendingReleases();
  }
  for (auto& [owner, releases] : pending) {
    // One call per owner and count (almost always 1).
    std::map<int, std::vector<std::string>> by_count;
    for (auto& [id, n] : releases) by_count[n].push_back(std::move(id));
    for (auto& [n, ids] : by_count) {
      // An owner that is gone has nothing left to release: errors are ignored.
      (void)CallBorrow(owner, address_, -n, ids, nullptr, deadline_ms, cancellable);
    }
  }
}

void CoreWorker::ProbeBorrowers() {
  std::vector<std::string> addrs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    addrs = refs_.BorrowerAddresses();
  }
  if (addrs.empty()) return;
  // All probes at once (asynchronous calls on one completion queue): a round takes one deadline
  // however many borrowers are gone, and queued releases wait behind it no longer than that.
  struct Probe {
    std::unique_ptr<rpc::CoreWorker::Stub> stub;
    std::unique_ptr<grpc::ClientContext> ctx;
    rpc::BorrowObjectsReply reply;
    grpc::Status st;
    std::unique_ptr<grpc::ClientAsyncResponseReader<rpc::BorrowObjectsReply>> call;
  };
  grpc::CompletionQueue cq;
  std::vector<Probe> probes(addrs.size());
  rpc::BorrowObjectsRequest req;  // no ids: only asks whether the borrower is there
  for (size_t i = 0; i < addrs.size(); ++i) {
    Probe& p = probes[i];
    p.stub = rpc::CoreWorker::NewStub(GetChannel(addrs[i]));
    p.ctx = TrackedContext(1000);
    p.call = p.stub->AsyncBorrowObjects(p.ctx.get(), req, &cq);
    p.call->Finish(&p.reply, &p.st, &p);
  }
  for (size_t n = 0; n < probes.size(); ++n) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
  }
  for (auto& p : probes) ReleaseContext(p.ctx.get());
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  for (size_t i = 0; i < addrs.size(); ++i) {
    const std::string& addr = addrs[i];
    const grpc::Status& st = probes[i].st;
    if (shutting_down_) return;
    auto outcome = ReferenceCounter::ProbeOutcome::kAnswered;
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
      outcome = ReferenceCounter::ProbeOutcome::kRefused;
    } else if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      outcome = ReferenceCounter::ProbeOutcome::kTimedOut;
    }
    std::lock_guard<std::mutex> lock(mu_);
    int regs = 0;
    if (refs_.OnProbe(addr, outcome, &regs)) {
      TORUS_LOG(WARNING) << "borrower " << addr << " is gone (" << st.error_message()
                         << "); dropping its " << regs << " reference(s)";
    }
  }
}

void CoreWorker::ReleaseAllBorrows(int deadline_ms) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    refs_.QueueAllBorrowReleases();
  }
  // Sent from this thread, now, not cancelled by shutdown: the process is about to end.
  FlushBorrowReleases(deadline_ms, /*cancellable=*/false);
}

// ------------------------------------------------------------------------------- submission

void CoreWorker::PrepareArgs(std::vector<internal::TaskArg>& args, rpc::TaskSpec* spec,
                             std::vector<std::string>* deps) {
  for (auto& a : args) {
    rpc::Arg* out = spec->add_args();
    // Refs inside a by-value argument are pinned like ref arguments, until the task has run:
    // the executor registers as a borrower of those it keeps.
    for (auto& n : a.nested_ids) {
      out->add_nested_ids(n);
      deps->push_back(std::move(n));
    }
    if (!a.is_ref && a.value.size() >= kInlineLimit) {
      // Large by-value arguments go through the object store like any large value.
      mu_.unlock();
      std::string id;
      try {
        id = Put(std::move(a.value));
      } catch (...) {
        mu_.lock();
        throw;
      }
      mu_.lock();
      a.is_ref = true;
      a.ref_id = id;
      refs_.Entry(id).local_refs--;  // the task's pin below keeps it alive instead
    }
    if (!a.is_ref) {
      out->set_value(std::move(a.value));
      continue;
    }
    out->set_is_ref(true);
    out->set_ref_id(a.ref_id);
    deps->push_back(a.ref_id);
  }
}

std::string CoreWorker::SubmitTask(const std::string& function_name,
                                   std::vector<internal::TaskArg> args,
                                   const internal::TaskOptions& options) {
  auto t = std::make_shared<TaskRecord>();
  rpc::TaskSpec& spec = t->spec;
  spec.set_function(function_name);
  spec.set_owner_address(address_);
  spec.set_driver_address(DriverAddress());
  spec.set_job_id(JobId());
  spec.set_ray_namespace(GetNamespace());
  spec.set_name(options.name.empty() ? function_name : options.name);
  const bool python = options.language == internal::Language::kPython;
  if (python) spec.set_language(rpc::PYTHON);
  std::map<std::string, std::string> selector(options.label_selector.begin(),
                                              options.label_selector.end());
  std::string key = SchedulingKey(options, selector, &spec);
  if (python) key += "|py";
  // Negative means "retry forever", as in Ray.
  t->max_retries = options.max_retries < 0 ? std::numeric_limits<int>::max() : options.max_retries;
  t->retry_exceptions = options.retry_exceptions;
  SetJobConfig(options.serialized_runtime_env, &spec);
  const std::string env_key = EnvVarsKey(spec.env_vars());  // no sharing across env_vars
  key += env_key;
  t->key = key;
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) throw internal::RayException("ray::Shutdown() has been called");
  std::string rid = NewReturnObject(&spec);
  std::vector<std::string> refs;
  PrepareArgs(args, &spec, &refs);
  auto& q = queues_[key];
  if (!q) {
    q = NewSchedulingQueue(key, spec, options, selector,
                           (python ? python_runtime_key_ : runtime_key_) + env_key);
  }
  TrackArgs(t, refs);
  SetTaskState(spec, t->missing ? "PENDING_ARGS" : "PENDING");
  if (t->missing == 0) {
    FillResolvedArgs(*t);
    Enqueue(t);
  }
  return rid;
}

std::string CoreWorker::SchedulingKey(const internal::TaskOptions& options,
                                      const std::map<std::string, std::string>& selector,
                                      rpc::TaskSpec* spec) {
  std::string key;
  if (options.resources.empty()) {
    // The default shape {CPU: 1}: its proto and key are built once, not per task.
    static const auto* kDefault = [] {
      auto* d = new std::pair<rpc::ResourceSet, std::string>();
      ResourceMap cpu1{{"CPU", 1}};
      ToProto(cpu1, &d->first);
      d->second = ResourcesToString(cpu1);
      return d;
    }();
    *spec->mutable_resources() = kDefault->first;
    key = kDefault->second;
  } else {
    ResourceMap res(options.resources.begin(), options.resources.end());
    if (auto it = res.find("TPU"); it != res.end()) {
      if (auto st = tpu::ValidateTaskTpuRequest(it->second); !st.ok()) {
        throw internal::RayException(st.ToString());
      }
    }
    ToProto(res, spec->mutable_resources());
    key = ResourcesToString(res);
  }
  if (!options.placement_group_id.empty()) {
    key += "|pg=" + options.placement_group_id + ":" + std::to_string(options.bundle_index);
  }
  if (!selector.empty()) {
    auto terms = ParseLabelSelector(selector);
    if (!terms.ok()) throw internal::RayException(terms.status().message());
    for (const auto& [k, v] : selector) key += "|" + k + "=" + v;
  }
  return key;
}

std::unique_ptr<SchedulingQueue> CoreWorker::NewSchedulingQueue(
    const std::string& key, const rpc::TaskSpec& spec, const internal::TaskOptions& options,
    const std::map<std::string, std::string>& selector, const std::string& runtime_key) {
  auto q = std::make_unique<SchedulingQueue>();
  q->key = key;
  auto& lt = q->lease_template;
  *lt.mutable_resources() = spec.resources();
  lt.set_runtime_key(runtime_key);
  *lt.mutable_env_vars() = spec.env_vars();
  lt.set_executable(executable_);
  if (spec.language() == rpc::PYTHON) {
    for (const auto& a : python_command_) lt.add_worker_command(a);
  } else {
    for (const auto& p : opts_.code_search_path) lt.add_code_search_path(p);
  }
  lt.set_job_id(opts_.job_id);
  lt.set_owner_address(address_);
  lt.set_description("task " + spec.function());
  lt.set_placement_group_id(options.placement_group_id);
  lt.set_bundle_index(options.bundle_index);
  for (const auto& [k, v] : selector) {
    auto* term = lt.add_label_selector();
    term->set_key(k);
    term->set_expr(v);
  }
  if (!options.placement_group_id.empty()) lt.set_spilled(true);  // the bundle decides: no spillback
  return q;
}

std::string CoreWorker::NewReturnObject(rpc::TaskSpec* spec) {
  std::string rid = NewObjectId();
  spec->set_task_id(HexOf(rid));
  spec->set_return_id(rid);
  ObjectEntry& re = refs_.Entry(rid);
  re.owned = true;
  re.local_refs = 1;
  return rid;
}

void CoreWorker::TrackArgs(const std::shared_ptr<TaskRecord>& t, const std::vector<std::string>& refs) {
  for (const auto& id : refs) {
    refs_.Pin(id);
    t->pinned.push_back(id);
  }
  // Dependencies: owned objects not yet ready hold the task back.
  const rpc::TaskSpec& spec = t->spec;
  for (int i = 0; i < spec.args_size(); ++i) {
    if (!spec.args(i).is_ref()) continue;
    const std::string& id = spec.args(i).ref_id();
    ObjectEntry* e = refs_.Find(id);
    if (e && e->owned && !e->ready) {
      t->missing++;
      waiting_on_.emplace(id, t);
    }
  }
}

void CoreWorker::FillResolvedArgs(TaskRecord& t) {
  for (int i = 0; i < t.spec.args_size(); ++i) {
    rpc::Arg* a = t.spec.mutable_args(i);
    if (!a->is_ref() || a->location_known()) continue;
    bool is_error = false;
    rpc::Error err;
    if (LocationOf(a->ref_id(), a->mutable_location(), &is_error, &err)) {
      if (is_error) {
        // A failed dependency fails the task with the same error, as in Ray.
        a->clear_location();
        continue;
      }
      a->set_location_known(true);
    }
  }
}

void CoreWorker::OnObjectReady(const std::string& id) {
  auto range = waiting_on_.equal_range(id);
  std::vector<std::shared_ptr<TaskRecord>> ready;
  for (auto it = range.first; it != range.second; ++it) {
    if (--it->second->missing == 0) ready.push_back(it->second);
  }
  waiting_on_.erase(range.first, range.second);
  for (auto& t : ready) {
    // If a dependency failed, the task fails with that error without running.
    for (const auto& a : t->spec.args()) {
      if (!a.is_ref()) continue;
      auto it = refs_.objects().find(a.ref_id());
      if (it != refs_.objects().end() && it->second.is_error) {
        rpc::TaskResult r;
        r.set_is_error(true);
        *r.mutable_error() = it->second.error;
        ReleaseTaskPins(*t);
        StoreResult(t->spec.return_id(), r);
        t.reset();
        break;
      }
    }
    if (!t) continue;
    if (t->cancelled && t->actor_id.empty()) {
      FailTask(*t, StatusCode::kCancelled, CancelMessage(*t));
      continue;
    }
    FillResolvedArgs(*t);
    if (!t->actor_id.empty()) {
      auto ait = actors_.find(t->actor_id);
      if (ait != actors_.end()) PumpActor(*ait->second);
    } else {
      Enqueue(t);
    }
  }
}

void CoreWorker::Enqueue(std::shared_ptr<TaskRecord> t) {
  auto& q = *queues_[t->key];
  q.tasks.push_back(std::move(t));
  PumpQueue(q);
}

int CoreWorker::PipelineDepth(const std::string& function) const {
  // Short functions are pipelined to a worker (batching hides the round trip); long or unknown
  // ones go one per worker, so they spread over workers and nodes.
  auto it = exec_avg_us_.find(function);
  return (it != exec_avg_us_.end() && it->second < 2000) ? kMaxPipelineDepth : 1;
}

void CoreWorker::PumpQueue(SchedulingQueue& q) {
  // With deep pipelining a lease is topped up only once half of its window is free, and then
  // filled in one go: a sequential worker answers each batch with one result batch, so
  // refilling a few slots per returned batch would keep every batch as small as the first
  // ones for as long as the stream lives.
  std::vector<std::pair<Conn*, std::vector<std::shared_ptr<TaskRecord>>>> out;
  auto opened = [&](Conn* c) {
    for (auto& o : out) {
      if (o.first == c) return &o.second;
    }
    return static_cast<std::vector<std::shared_ptr<TaskRecord>>*>(nullptr);
  };
  while (!q.tasks.empty()) {
    int depth = PipelineDepth(q.tasks.front()->spec.function());
    int refill_below = depth > 1 ? depth / 2 : depth;
    Conn* best = nullptr;
    for (Conn* c : q.leases) {
      if (c->broken || c->returned) continue;
      int n = static_cast<int>(c->in_flight.size());
      if (n >= depth) continue;
      if (n >= refill_below && !opened(c)) continue;
      if (!best || c->in_flight.size() < best->in_flight.size()) best = c;
    }
    if (!best) break;
    auto t = std::move(q.tasks.front());
    q.tasks.pop_front();
    t->conn = best;
    t->sent_at = Clock::now();
    best->in_flight[TaskCounterOf(t->spec.task_id())] = t;
    SetTaskState(t->spec, "RUNNING", best->worker_id);
    auto* v = opened(best);
    if (!v) {
      out.emplace_back(best, std::vector<std::shared_ptr<TaskRecord>>());
      v = &out.back().second;
    }
    v->push_back(std::move(t));
  }
  for (auto& [c, ts] : out) {
    // A lone task on an idle stream with nothing else queued: the caller writes it itself.
    bool direct = ts.size() == 1 && c->in_flight.size() == 1 && q.tasks.empty();
    c->SendAll(std::move(ts), direct);
  }
  if (!q.tasks.empty() && q.lease_requests < kMaxLeaseRequestsInFlight) RequestLease(q);
}

void CoreWorker::RequestLease(SchedulingQueue& q) {
  q.lease_requests++;
  rpc::LeaseRequest req = q.lease_template;
  SpawnTracked([this, key = q.key, req, addr = opts_.node_address, spread = q.lease_spread++] {
    LeaseThread(key, req, addr, spread);
  });
}

void CoreWorker::LeaseThread(std::string key, rpc::LeaseRequest req, std::string node_address,
                             int spread) {
  rpc::LeaseReply reply;
  std::string error;
  if (!req.placement_group_id().empty()) {
    // Lease straight from the node of the bundle (waits while the group is not CREATED, e.g.
    // while a lost slice is re-granted).
    auto node = BundleNode(req.placement_group_id(), req.bundle_index(), FromProto(req.resources()),
                           spread);
    if (!node.ok()) error = node.status().message();
    else node_address = *node;
  }
  if (error.empty()) error = RequestLeaseFrom(req, &node_address, &reply);
  std::unique_ptr<Conn> conn;
  if (error.empty() && shutting_down_) {
    rpc::ReturnLeaseRequest rreq;
    rreq.set_lease_id(reply.lease_id());
    rpc::Empty e;
    auto ctx = NewContext(opts_.token, 5000);
    (void)NodeStub(node_address)->ReturnLease(ctx.get(), rreq, &e);
  }
  if (error.empty() && !shutting_down_) {
    conn = std::make_unique<Conn>(this, reply.worker_address(), opts_.token);
    conn->SetLease(reply.lease_id());
    conn->key = key;
    conn->lease_id = reply.lease_id();
    conn->worker_id = reply.worker_id();
    conn->node_address = node_address;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto& q = *queues_[key];
  q.lease_requests--;
  if (shutting_down_) return;
  if (!error.empty()) {
    TORUS_LOG(ERROR) << "cannot get a worker for " << q.lease_template.description() << ": " << error;
    for (auto& t : q.tasks) FailTask(*t, StatusCode::kWorkerDied, "cannot get a worker: " + error);
    q.tasks.clear();
    cv_.notify_all();
    return;
  }
  Conn* c = conn.get();
  conns_.push_back(std::move(conn));
  q.leases.push_back(c);
  c->idle_since = Clock::now();
  PumpQueue(q);
  WakeHousekeeping();
}

std::string CoreWorker::RequestLeaseFrom(rpc::LeaseRequest& req, std::string* node_address,
                                         rpc::LeaseReply* reply) {
  // A request spilled to a node that cannot serve it waits there, and is spilled on only after
  // waiting (Node::TrySpillback), so following spillbacks needs no hop limit.
  int fallbacks = 0;
  for (int hops = 0;; ++hops) {
    if (hops > 0 && hops % 16 == 0) {
      TORUS_LOG(WARNING) << "lease request for " << req.description() << " spilled " << hops
                         << " times; still looking for a node with room";
    }
    auto stub = NodeStub(*node_address);
    auto ctx = TrackedContext();
    reply->Clear();
    auto st = stub->RequestLease(ctx.get(), req, reply);
    ReleaseContext(ctx.get());
    if (!st.ok()) {
      // A node we were spilled to that went away: ask our own node again (a few times).
      if (req.placement_group_id().empty() && *node_address != opts_.node_address &&
          !shutting_down_ && ++fallbacks <= 3 && st.error_code() != grpc::StatusCode::CANCELLED) {
        TORUS_LOG(WARNING) << "lease request to node " << *node_address << " failed ("
                           << st.error_message() << "); asking node " << opts_.node_address;
        *node_address = opts_.node_address;
        req.set_spilled(false);
        continue;
      }
      return "lease request to node " + *node_address + " failed: " + st.error_message();
    }
    if (reply->has_error() && reply->error().code() != 0) return reply->error().message();
    if (reply->granted()) return "";
    if (!reply->spillback_node_address().empty()) {
      *node_address = reply->spillback_node_address();
      req.set_spilled(true);
      continue;
    }
    return "node returned an empty lease reply";
  }
}

void CoreWorker::ReturnLease(Conn* conn, bool worker_dead) {
  rpc::ReturnLeaseRequest req;
  req.set_lease_id(conn->lease_id);
  req.set_worker_dead(worker_dead);
  rpc_work_->Post([req, addr = conn->node_address, token = opts_.token] {
    rpc::Empty e;
    auto ctx = NewContext(token, 5000);
    (void)rpc::Node::NewStub(GetChannel(addr))->ReturnLease(ctx.get(), req, &e);
  });
}

namespace {
// A Python task's raised exception, stored as its value (docs/python.md "Values": 0xC1 'E').
// Such values are small, hence inline.
bool IsExceptionValue(const rpc::ObjectLocation& v) {
  const std::string& d = v.inline_data();
  return !v.in_shm() && d.size() >= 2 && d[0] == '\xc1' && d[1] == 'E';
}
}  // namespace

void CoreWorker::OnResults(Conn* conn, rpc::ResultBatch& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulingQueue* q = nullptr;
  if (conn->actor_id.empty()) {
    auto it = queues_.find(conn->key);
    if (it != queues_.end()) q = it->second.get();
  }
  for (auto& r : *batch.mutable_results()) {
    auto it = conn->in_flight.find(TaskCounterOf(r.task_id()));
    if (it == conn->in_flight.end()) continue;
    auto t = it->second;
    conn->in_flight.erase(it);
    if (q && !r.is_error()) {
      double x = static_cast<double>(r.exec_us());
      auto [avg, fresh] = exec_avg_us_.try_emplace(t->spec.function(), x);
      if (!fresh) avg->second = 0.8 * avg->second + 0.2 * x;
    }
    if (t->cancelled) {
      FailTask(*t, StatusCode::kCancelled, CancelMessage(*t));
      continue;
    }
    if (t->retry_exceptions && !r.is_error() && t->spec.attempt() < t->max_retries &&
        IsExceptionValue(r.value())) {
      Resubmit(*t);
      continue;
    }
    ReleaseTaskPins(*t);
    SetTaskState(t->spec, r.is_error() ? "FAILED" : "FINISHED", conn->worker_id,
                 r.is_error() ? r.error().message() : "");
    StoreResult(t->spec.return_id(), r);
  }
  if (conn->in_flight.empty()) conn->idle_since = Clock::now();
  if (q) PumpQueue(*q);
  if (q && conn->in_flight.empty()) WakeHousekeeping();
}

void CoreWorker::ReleaseTaskPins(TaskRecord& t) {
  for (const auto& id : t.pinned) {
    refs_.Unpin(id);
  }
  t.pinned.clear();
}

void CoreWorker::FailTask(TaskRecord& t, StatusCode code, const std::string& msg) {
  SetTaskState(t.spec, "FAILED", "", msg);
  ReleaseTaskPins(t);
  FailObject(t.spec.return_id(), code, msg);
}

void CoreWorker::OnConnBroken(Conn* conn, const std::string& why) {
  std::vector<std::shared_ptr<TaskRecord>> lost;
  std::string worker_id, node_address, actor_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lost = DetachConn(conn);
    worker_id = conn->worker_id;
    node_address = conn->node_address;
    actor_id = conn->actor_id;
  }
  if (shutting_down_) return;
  if (!actor_id.empty()) {
    // Actor: in-flight calls fail; queued ones wait for a restart (or fail if the actor is dead).
    SpawnTracked([this, actor_id, lost, why] { FailActorCalls(actor_id, lost, why); });
    return;
  }
  if (why.find(kLeaseRevokedError) != std::string::npos) {
    // The grant reached us after the node had taken the lease back: the worker is alive and ran
    // none of these. Queue them again without spending a retry.
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : lost) {
      auto fresh = std::make_shared<TaskRecord>(*t);
      fresh->conn = nullptr;
      SetTaskState(fresh->spec, "PENDING");
      Enqueue(fresh);
    }
    return;
  }
  ReturnLease(conn, true);
  if (lost.empty()) return;
  // Ask the node how the worker ended, for the error message, then retry or fail.
  SpawnTracked([this, lost, worker_id, node_address, why] {
    RetryLostTasks(lost, worker_id, node_address, why);
  });
}

std::vector<std::shared_ptr<TaskRecord>> CoreWorker::DetachConn(Conn* conn) {
  std::vector<std::shared_ptr<TaskRecord>> lost;
  conn->broken = true;
  for (auto& [id, t] : conn->in_flight) lost.push_back(t);
  conn->in_flight.clear();
  if (conn->actor_id.empty()) {
    auto it = queues_.find(conn->key);
    if (it != queues_.end()) {
      auto& ls = it->second->leases;
      ls.erase(std::remove(ls.begin(), ls.end(), conn), ls.end());
    }
  } else {
    auto it = actors_.find(conn->actor_id);
    if (it != actors_.end() && it->second->conn == conn) it->second->conn = nullptr;
  }
  // Hand the Conn to housekeeping to be joined (we are running on its reader thread); once
  // shutting down, Shutdown() joins what is in dead_conns_ when it takes conns_.
  for (auto it = conns_.begin(); it != conns_.end(); ++it) {
    if (it->get() == conn) {
      dead_conns_.push_back(std::move(*it));
      if (!shutting_down_) WakeHousekeeping();
      conns_.erase(it);
      break;
    }
  }
  return lost;
}

void CoreWorker::FailActorCalls(const std::string& actor_id,
                                const std::vector<std::shared_ptr<TaskRecord>>& lost,
                                const std::string& why) {
  std::string cause = "the actor's worker stopped (" + why + ")";
  int restarts = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = actors_.find(actor_id);
    if (it != actors_.end()) restarts = it->second->known_restarts;
  }
  rpc::GetActorRequest req;
  req.set_actor_id(actor_id);
  req.set_wait_alive_ms(2000);
  req.set_min_restarts(restarts + 1);
  rpc::GetActorReply reply;
  auto ctx = NewContext(opts_.token, 10000);
  if (head_->GetActor(ctx.get(), req, &reply).ok() && reply.found()) {
    const auto& a = reply.actor();
    if (a.state() == "DEAD") cause = a.death_cause();
    else cause = "the actor's worker died and the actor was restarted";
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& t : lost) {
    FailTask(*t, StatusCode::kActorDied, "actor " + actor_id + " died while running " +
                                             t->spec.function() + ": " + cause);
  }
  auto it = actors_.find(actor_id);
  if (it != actors_.end()) {
    it->second->known_restarts = restarts + 1;
    PumpActor(*it->second);
  }
  cv_.notify_all();
}

void CoreWorker::RetryLostTasks(const std::vector<std::shared_ptr<TaskRecord>>& lost,
                                const std::string& worker_id, const std::string& node_address,
                                const std::string& why) {
  std::string desc = "its connection broke (" + why + ")";
  rpc::WorkerExitRequest req;
  req.set_worker_id(worker_id);
  rpc::WorkerExitReply reply;
  auto ctx = NewContext(opts_.token, 3000);
  bool slice_lost = false;
  if (NodeStub(node_address)->GetWorkerExit(ctx.get(), req, &reply).ok() && reply.exited()) {
    desc = reply.description();
    slice_lost = reply.code() == static_cast<int>(StatusCode::kSliceLost);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& t : lost) {
    if (slice_lost) {
      RetryOrFail(t, desc, nullptr, StatusCode::kSliceLost);
    } else {
      RetryOrFail(t, "worker " + worker_id + " " + desc, nullptr);
    }
  }
  cv_.notify_all();
}

void CoreWorker::Resubmit(const TaskRecord& t) {
  // A fresh record: the old connection's writer may still be reading the sent spec.
  auto again = std::make_shared<TaskRecord>(t);
  again->spec.set_attempt(again->spec.attempt() + 1);
  again->conn = nullptr;
  SetTaskState(again->spec, "PENDING");
  Enqueue(std::move(again));
}

void CoreWorker::RetryOrFail(std::shared_ptr<TaskRecord> t, const std::string& why, Conn*,
                             StatusCode code) {
  if (t->cancelled) {
    FailTask(*t, StatusCode::kCancelled, CancelMessage(*t));
    return;
  }
  if (t->spec.attempt() < t->max_retries) {
    TORUS_LOG(INFO) << "retrying task " << t->spec.function() << " (attempt "
                    << t->spec.attempt() + 2 << " of " << t->max_retries + 1 << ") because " << why;
    Resubmit(*t);
    return;
  }
  if (code == StatusCode::kSliceLost) {
    FailTask(*t, code, "task " + t->spec.function() + " failed: " + why + " (after " +
                           std::to_string(t->spec.attempt() + 1) + " attempt(s))");
    return;
  }
  FailTask(*t, StatusCode::kWorkerDied,
           "task " + t->spec.function() + " failed: the worker running it died (" + why + ") after " +
               std::to_string(t->spec.attempt() + 1) + " attempt(s)");
}

// ------------------------------------------------------------------------------- cancel

std::string CoreWorker::CancelMessage(const TaskRecord& t) {
  return "task " + t.spec.name() + " (" + t.spec.task_id() + ") was cancelled";
}

bool CoreWorker::Cancel(const std::string& object_id, bool force) {
  std::string kill_worker, kill_node;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto drop = [&](std::deque<std::shared_ptr<TaskRecord>>& q) {
      for (auto it = q.begin(); it != q.end(); ++it) {
        if ((*it)->spec.return_id() != object_id) continue;
        auto t = *it;
        q.erase(it);
        FailTask(*t, StatusCode::kCancelled, CancelMessage(*t));
        return true;
      }
      return false;
    };
    // Not sent yet: queued for a lease, or an actor call waiting for its actor.
    for (auto& [key, q] : queues_) {
      if (drop(q->tasks)) return true;
    }
    for (auto& [id, a] : actors_) {
      if (drop(a->waiting)) return true;
    }
    // Waiting for its arguments: it is enqueued once they are ready, and then fails at once.
    for (auto& [dep, t] : waiting_on_) {
      if (t->spec.return_id() == object_id && !t->cancelled) {
        t->cancelled = true;
        return true;
      }
    }
    // Running: its value is dropped when it comes; `force` kills the worker (not an actor's).
    for (auto& c : conns_) {
      for (auto& [n, t] : c->in_flight) {
        if (t->spec.return_id() != object_id) continue;
        t->cancelled = true;
        if (force && c->actor_id.empty()) {
          kill_worker = c->worker_id;
          kill_node = c->node_address;
        }
        break;
      }
      if (!kill_worker.empty()) break;
    }
    if (kill_worker.empty()) return refs_.Find(object_id) != nullptr;
  }
  rpc::KillWorkerRequest req;
  req.set_worker_id(kill_worker);
  req.set_force(true);
  rpc::Empty e;
  auto ctx = NewContext(opts_.token, 5000);
  (void)NodeStub(kill_node)->KillWorker(ctx.get(), req, &e);
  return true;
}

// ------------------------------------------------------------------------------- actors

std::string CoreWorker::CreateActor(const std::string& factory_name,
                                    std::vector<internal::TaskArg> args,
                                    const internal::ActorOptions& options) {
  rpc::CreateActorRequest req;
  req.set_placement_group_id(options.placement_group_id);
  req.set_bundle_index(options.bundle_index);
  for (const auto& [k, v] : options.label_selector) {
    auto* term = req.add_label_selector();
    term->set_key(k);
    term->set_expr(v);
  }
  std::string actor_id = RandomHex(16);
  rpc::TaskSpec* spec = req.mutable_creation();
  spec->set_actor_id(actor_id);
  spec->set_actor_creation(true);
  spec->set_function(factory_name);
  const bool python = options.language == internal::Language::kPython;
  if (python) spec->set_language(rpc::PYTHON);
  spec->set_owner_address(address_);
  spec->set_driver_address(DriverAddress());
  spec->set_job_id(JobId());
  spec->set_max_concurrency(std::max(1, options.max_concurrency));
  spec->set_task_id(actor_id);
  std::string ns = options.ray_namespace.empty() ? GetNamespace() : options.ray_namespace;
  spec->set_ray_namespace(ns);
  SetJobConfig(options.serialized_runtime_env, spec);
  // Refs inside constructor arguments stay held by this process for as long as it lives: a
  // restarted actor unpacks the same arguments again.
  std::vector<std::string> ctor_nested;
  for (auto& a : args) {
    for (auto& n : a.nested_ids) ctor_nested.push_back(std::move(n));
    a.nested_ids.clear();
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (const auto& n : ctor_nested) refs_.Entry(n).local_refs++;
    std::vector<std::string> refs;
    PrepareArgs(args, spec, &refs);
    // Constructor arguments must be values the node can hand over: resolve refs now.
    lock.unlock();
    for (int i = 0; i < spec->args_size(); ++i) {
      rpc::Arg* a = spec->mutable_args(i);
      if (!a->is_ref()) continue;
      auto bufs = Get({a->ref_id()}, -1);
      a->set_is_ref(false);
      a->set_value(std::string(bufs[0]->data(), bufs[0]->size()));
    }
    lock.lock();
    for (auto& id : refs) {
      refs_.ReleaseIfUnused(id);
    }
  }
  req.set_name(options.name);
  req.set_ray_namespace(ns);
  req.set_max_restarts(options.max_restarts);
  req.set_detached(options.lifetime_set ? options.detached : spec->default_detached());
  req.set_executable(executable_);
  if (python) {
    for (const auto& a : python_command_) req.add_worker_command(a);
  } else {
    for (const auto& p : opts_.code_search_path) req.add_code_search_path(p);
  }
  ResourceMap res(options.resources.begin(), options.resources.end());
  if (auto it = res.find("TPU"); it != res.end()) {
    if (auto st = tpu::ValidateTaskTpuRequest(it->second); !st.ok()) {
      throw internal::RayException(st.ToString());
    }
  }
  ToProto(res, req.mutable_resources());
  *spec->mutable_resources() = req.resources();  // what the actor holds, for its runtime context
  rpc::CreateActorReply reply;
  auto ctx = NewContext(opts_.token, 30000);
  auto st = head_->CreateActor(ctx.get(), req, &reply);
  if (!st.ok()) throw internal::RayException("cannot create actor: " + st.error_message());
  if (reply.has_error() && reply.error().code() != 0) {
    throw internal::RayException("cannot create actor: " + reply.error().message());
  }
  return actor_id;
}

std::string CoreWorker::SubmitActorTask(const std::string& actor_id, const std::string& method_name,
                                        std::vector<internal::TaskArg> args,
                                        const internal::TaskOptions& options) {
  auto t = std::make_shared<TaskRecord>();
  t->actor_id = actor_id;
  rpc::TaskSpec& spec = t->spec;
  spec.set_function(method_name);
  if (options.language == internal::Language::kPython) spec.set_language(rpc::PYTHON);
  spec.set_actor_id(actor_id);
  spec.set_owner_address(address_);
  spec.set_driver_address(DriverAddress());
  spec.set_caller_id(opts_.worker_id);
  spec.set_job_id(JobId());
  spec.set_ray_namespace(GetNamespace());
  SetJobConfig("", &spec, /*with_env=*/false);  // the actor's process has its own env_vars
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) throw internal::RayException("ray::Shutdown() has been called");
  std::string rid = NewReturnObject(&spec);
  std::vector<std::string> refs;
  PrepareArgs(args, &spec, &refs);
  TrackArgs(t, refs);
  if (t->missing == 0) FillResolvedArgs(*t);
  auto& a = actors_[actor_id];
  if (!a) {
    a = std::make_unique<ActorQueue>();
    a->actor_id = actor_id;
  }
  spec.set_seq(a->next_seq++);
  SetTaskState(spec, t->missing ? "PENDING_ARGS" : "PENDING");
  a->waiting.push_back(t);
  PumpActor(*a);
  return rid;
}

void CoreWorker::PumpActor(ActorQueue& a) {
  if (a.dead) {
    for (auto& t : a.waiting) {
      FailTask(*t, StatusCode::kActorDied, "actor " + a.actor_id + " is dead: " + a.death_cause);
    }
    a.waiting.clear();
    cv_.notify_all();
    return;
  }
  if (!a.conn) {
    if (!a.resolving && !a.waiting.empty()) {
      a.resolving = true;
      SpawnTracked([this, id = a.actor_id, r = a.known_restarts] { ResolveActor(id, r); });
    }
    return;
  }
  // Submission order: stop at the first call whose arguments are not ready yet.
  while (!a.waiting.empty() && a.waiting.front()->missing == 0) {
    auto t = std::move(a.waiting.front());
    a.waiting.pop_front();
    t->conn = a.conn;
    a.conn->in_flight[TaskCounterOf(t->spec.task_id())] = t;
    SetTaskState(t->spec, "RUNNING", a.conn->worker_id);
    a.conn->Send(std::move(t), a.conn->in_flight.size() == 1 && a.waiting.empty());
  }
}

void CoreWorker::ResolveActor(const std::string& actor_id, int min_restarts) {
  rpc::GetActorReply reply;
  grpc::Status st;
  while (!shutting_down_) {
    rpc::GetActorRequest req;
    req.set_actor_id(actor_id);
    req.set_wait_alive_ms(2000);
    req.set_min_restarts(min_restarts);
    reply.Clear();
    auto ctx = NewContext(opts_.token, 10000);
    st = head_->GetActor(ctx.get(), req, &reply);
    if (!st.ok() || !reply.found()) break;
    const auto& s = reply.actor().state();
    if (s == "DEAD" || (s == "ALIVE" && reply.actor().num_restarts() >= min_restarts)) break;
  }
  std::unique_ptr<Conn> conn;
  bool alive = st.ok() && reply.found() && reply.actor().state() == "ALIVE";
  if (alive && !shutting_down_) {
    conn = std::make_unique<Conn>(this, reply.actor().address(), opts_.token);
    conn->actor_id = actor_id;
    conn->worker_id = reply.actor().worker_id();
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = actors_.find(actor_id);
  if (it == actors_.end() || shutting_down_) return;
  ActorQueue& a = *it->second;
  a.resolving = false;
  if (conn) {
    a.known_restarts = reply.actor().num_restarts();
    a.conn = conn.get();
    conns_.push_back(std::move(conn));
  } else {
    a.dead = true;
    if (!st.ok()) {
      a.death_cause = "the head is unreachable: " + st.error_message();
    } else if (!reply.found()) {
      a.death_cause = "no such actor";
    } else {
      a.death_cause = reply.actor().death_cause();
    }
  }
  PumpActor(a);
}

StatusOr<std::string> CoreWorker::BundleNode(const std::string& pg_id, int bundle_index,
                                             const ResourceMap& res, int spread) {
  rpc::PlacementGroupRequest req;
  req.set_pg_id(pg_id);
  req.set_wait_created_ms(0);
  rpc::GetPlacementGroupReply reply;
  // Wait for the group to be placed: work submitted into a pending group waits for it.
  while (true) {
    reply.Clear();
    req.set_wait_created_ms(2000);
    auto st = LaneUnary(opts_.head_address, opts_.token, 10000, "/torus.rpc.Head/GetPlacementGroup",
                        &rpc::Head::Service::GetPlacementGroup, &rpc::Head::Stub::GetPlacementGroup, req, &reply);
    if (!st.ok()) return FromGrpc(st, "cannot look up placement group " + pg_id);
    if (!reply.found()) return NotFound("placement group " + pg_id + " does not exist");
    const auto& pg = reply.pg();
    if (pg.state() == "REMOVED") return NotFound("placement group " + pg_id + " was removed");
    if (bundle_index >= pg.bundles_size()) {
      return InvalidArgument("bundle index " + std::to_string(bundle_index) +
                             " out of range: placement group " + pg_id + " has " +
                             std::to_string(pg.bundles_size()) + " bundles");
    }
    if (pg.state() != "CREATED") {
      if (shutting_down_) return Unavailable("shutting down");
      continue;
    }
    const rpc::Bundle* fallback = nullptr;
    std::vector<const rpc::Bundle*> fitting;
    for (const auto& b : pg.bundles()) {
      if (bundle_index >= 0 && b.index() != bundle_index) continue;
      if (!fallback) fallback = &b;
      if (Fits(res, FromProto(b.resources()))) fitting.push_back(&b);
    }
    // Any bundle: successive lease requests go round the fitting bundles, so concurrent work
    // spreads over the group's bundles (and a slice's hosts) instead of queueing at the first.
    if (!fitting.empty()) return fitting[spread % fitting.size()]->node_address();
    // Asks more than the bundle holds: send it anyway; it stays pending there and is reported.
    return fallback->node_address();
  }
}

std::string CoreWorker::CreatePlacementGroup(const internal::PlacementGroupSpec& spec) {
  rpc::PlacementGroupRecord req;
  req.set_name(spec.name);
  req.set_ray_namespace(spec.ray_namespace.empty() ? GetNamespace() : spec.ray_namespace);
  req.set_strategy(spec.strategy);
  req.set_detached(spec.detached);
  req.set_job_id(JobId());
  if (spec.num_slices > 0) {
    auto* sl = req.mutable_slice();
    sl->set_topology(spec.slice_topology);
    sl->set_accelerator_version(spec.slice_version);
    sl->set_num_slices(spec.num_slices);
    sl->set_chips_per_vm(spec.chips_per_vm);
    sl->set_timeout_ms(spec.slice_timeout_ms);
  }
  if (!spec.bundle_selectors.empty() && spec.bundle_selectors.size() != spec.bundles.size()) {
    throw internal::RayException("bundle_label_selectors has " +
                                 std::to_string(spec.bundle_selectors.size()) +
                                 " entries for " + std::to_string(spec.bundles.size()) + " bundles");
  }
  for (size_t i = 0; i < spec.bundles.size(); ++i) {
    auto* b = req.add_bundles();
    for (const auto& [k, v] : spec.bundles[i]) (*b->mutable_resources()->mutable_amounts())[k] = v;
    if (!spec.bundle_selectors.empty()) {
      for (const auto& [k, v] : spec.bundle_selectors[i]) {
        auto* t = b->add_label_selector();
        t->set_key(k);
        t->set_expr(v);
      }
    }
  }
  rpc::CreatePlacementGroupReply reply;
  auto st = LaneUnary(opts_.head_address, opts_.token, 10000, "/torus.rpc.Head/CreatePlacementGroup",
                      &rpc::Head::Service::CreatePlacementGroup, &rpc::Head::Stub::CreatePlacementGroup, req, &reply);
  if (!st.ok()) throw internal::RayException("CreatePlacementGroup failed: " + st.error_message());
  if (reply.has_error() && reply.error().code() != 0) {
    throw internal::RayException("CreatePlacementGroup: " + reply.error().message());
  }
  if (reply.state() == "CREATED") {
    std::lock_guard<std::mutex> lock(mu_);
    created_pgs_.insert(reply.pg_id());
  }
  return reply.pg_id();
}

void CoreWorker::RemovePlacementGroup(const std::string& id) {
  rpc::PlacementGroupRequest req;
  req.set_pg_id(id);
  rpc::Empty e;
  auto st = LaneUnary(opts_.head_address, opts_.token, 30000, "/torus.rpc.Head/RemovePlacementGroup",
                      &rpc::Head::Service::RemovePlacementGroup, &rpc::Head::Stub::RemovePlacementGroup, req, &e);
  if (!st.ok()) throw internal::RayException("RemovePlacementGroup: " + st.error_message());
  std::lock_guard<std::mutex> lock(mu_);
  created_pgs_.erase(id);
  for (auto& [key, q] : queues_) {
    if (key.find("|pg=" + id + ":") == std::string::npos) continue;
    for (auto& t : q->tasks) FailTask(*t, StatusCode::kTaskError, "placement group " + id + " was removed");
    q->tasks.clear();
  }
  cv_.notify_all();
}

namespace {
internal::PlacementGroupInfo ToInfo(const rpc::PlacementGroupRecord& r) {
  internal::PlacementGroupInfo info;
  info.found = true;
  info.id = r.pg_id();
  info.state = r.state();
  info.spec.name = r.name();
  info.spec.ray_namespace = r.ray_namespace();
  info.spec.strategy = r.strategy();
  info.spec.detached = r.detached();
  for (const auto& b : r.bundles()) {
    info.spec.bundles.emplace_back(b.resources().amounts().begin(), b.resources().amounts().end());
    internal::LabelSelector sel;
    for (const auto& t : b.label_selector()) sel[t.key()] = t.expr();
    info.spec.bundle_selectors.push_back(sel);
    info.bundle_nodes.push_back(b.node_id());
  }
  info.slice_names.assign(r.slice_names().begin(), r.slice_names().end());
  info.epoch = r.epoch();
  info.pending_reason = r.pending_reason();
  if (r.has_slice()) {
    info.spec.num_slices = r.slice().num_slices();
    info.spec.slice_topology = r.slice().topology();
    info.spec.slice_version = r.slice().accelerator_version();
    info.spec.chips_per_vm = r.slice().chips_per_host();
  }
  return info;
}
}  // namespace

bool CoreWorker::WaitPlacementGroup(const std::string& id, int timeout_seconds) {
  {
    // Placed while CreatePlacementGroup ran: it has been ready, which is what Wait reports.
    std::lock_guard<std::mutex> lock(mu_);
    if (created_pgs_.count(id)) return true;
  }
  auto deadline = Clock::now() + std::chrono::seconds(std::max(0, timeout_seconds));
  while (true) {
    rpc::PlacementGroupRequest req;
    req.set_pg_id(id);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    req.set_wait_created_ms(std::max<int64_t>(0, std::min<int64_t>(left, 5000)));
    rpc::GetPlacementGroupReply reply;
    auto st = LaneUnary(opts_.head_address, opts_.token, 15000, "/torus.rpc.Head/GetPlacementGroup",
                        &rpc::Head::Service::GetPlacementGroup, &rpc::Head::Stub::GetPlacementGroup, req, &reply);
    if (!st.ok()) throw internal::RayException("PlacementGroup::Wait: " + st.error_message());
    if (!reply.found()) throw internal::RayException("PlacementGroup::Wait: no placement group " + id);
    if (reply.pg().state() == "CREATED") return true;
    if (reply.pg().state() == "REMOVED") {
      const std::string& why = reply.pg().pending_reason();
      throw internal::RayException("placement group " + id + " was removed" +
                                   (why.empty() ? std::string() : ": " + why));
    }
    if (Clock::now() >= deadline) return false;
  }
}

internal::PlacementGroupInfo CoreWorker::GetPlacementGroupInfo(const std::string& id,
                                                               const std::string& name) {
  rpc::PlacementGroupRequest req;
  req.set_pg_id(id);
  req.set_name(name);
  req.set_ray_namespace(GetNamespace());
  rpc::GetPlacementGroupReply reply;
  auto ctx = NewContext(opts_.token, 10000);
  auto st = head_->GetPlacementGroup(ctx.get(), req, &reply);
  if (!st.ok()) throw internal::RayException("GetPlacementGroup: " + st.error_message());
  if (!reply.found()) return {};
  return ToInfo(reply.pg());
}

std::vector<internal::PlacementGroupInfo> CoreWorker::GetAllPlacementGroups() {
  rpc::ListReply reply;
  auto ctx = NewContext(opts_.token, 10000);
  auto st = head_->List(ctx.get(), rpc::Empty(), &reply);
  if (!st.ok()) throw internal::RayException("GetAllPlacementGroups: " + st.error_message());
  std::vector<internal::PlacementGroupInfo> out;
  for (const auto& r : reply.placement_groups()) out.push_back(ToInfo(r));
  return out;
}

internal::SliceQueryResult CoreWorker::QuerySlices(const std::string& topology,
                                                   const std::string& version, int chips_per_vm,
                                                   const std::string& slice_name) {
  rpc::SliceQueryRequest req;
  req.set_topology(topology);
  req.set_accelerator_version(version);
  req.set_chips_per_vm(chips_per_vm);
  req.set_slice_name(slice_name);
  rpc::SliceQueryReply reply;
  auto ctx = NewContext(opts_.token, 10000);
  auto st = head_->QuerySlices(ctx.get(), req, &reply);
  if (!st.ok()) throw internal::RayException("slice query failed: " + st.error_message());
  if (reply.has_error() && reply.error().code() != 0) {
    throw internal::RayException(std::string(StatusCodeName(static_cast<StatusCode>(reply.error().code()))) +
                                 ": " + reply.error().message());
  }
  internal::SliceQueryResult out;
  out.intact = reply.intact();
  out.ready = reply.ready();
  out.node_ids.assign(reply.node_ids().begin(), reply.node_ids().end());
  return out;
}

std::string CoreWorker::GetNamedActor(const std::string& name, const std::string& ray_namespace) {
  rpc::GetActorRequest req;
  req.set_name(name);
  req.set_ray_namespace(ray_namespace.empty() ? GetNamespace() : ray_namespace);
  rpc::GetActorReply reply;
  auto ctx = NewContext(opts_.token, 10000);
  auto st = head_->GetActor(ctx.get(), req, &reply);
  if (!st.ok()) throw internal::RayException("GetActor failed: " + st.error_message());
  if (!reply.found() || reply.actor().state() == "DEAD") return "";
  return reply.actor().actor_id();
}

void CoreWorker::KillActor(const std::string& actor_id, bool no_restart) {
  rpc::KillActorRequest req;
  req.set_actor_id(actor_id);
  req.set_no_restart(no_restart);
  rpc::Empty e;
  auto ctx = NewContext(opts_.token, 10000);
  auto st = head_->KillActor(ctx.get(), req, &e);
  if (!st.ok()) throw internal::RayException("Kill failed: " + st.error_message());
}

void CoreWorker::ExitActor() {
  if (!task_executor_ || task_executor_->actor_id().empty()) {
    throw internal::RayException("ray::ExitActor() can only be called inside an actor method");
  }
  throw ExitActorSignal{};
}

bool CoreWorker::WasCurrentActorRestarted() {
  return task_executor_ && task_executor_->actor_restarted();
}

// ------------------------------------------------------------------------------- execution


void CoreWorker::SetTaskState(const rpc::TaskSpec& spec, const char* state,
                              const std::string& worker, const std::string& error) {
  uint64_t key = TaskCounterOf(spec.task_id());
  auto [it, fresh] = task_table_.try_emplace(key);
  TaskEntry& info = it->second;
  if (fresh) {
    info.name = spec.name().empty() ? spec.function() : spec.name();
    info.actor_id = spec.actor_id();
    info.job_id = spec.job_id();
    info.submitted_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  }
  info.state = state;
  info.attempt = spec.attempt();
  if (!worker.empty()) info.worker_id = worker;
  if (!error.empty()) info.error = error;
  if (state[0] == 'F') {  // FINISHED / FAILED
    finished_tasks_.push_back(key);
    while (finished_tasks_.size() > 10000) {
      task_table_.erase(finished_tasks_.front());
      finished_tasks_.pop_front();
    }
  }
}

grpc::Status CoreWorker::ListTasks(grpc::ServerContext* ctx, const rpc::Empty*, rpc::TaskList* out) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  std::string prefix = opts_.worker_id.substr(0, 16);
  for (const auto& [key, e] : task_table_) {
    rpc::TaskInfo* info = out->add_tasks();
    info->set_task_id(prefix + Hex64(key));
    info->set_name(e.name);
    info->set_state(e.state);
    info->set_worker_id(e.worker_id);
    info->set_attempt(e.attempt);
    info->set_error(e.error);
    info->set_actor_id(e.actor_id);
    info->set_job_id(e.job_id);
    info->set_submitted_ms(e.submitted_ms);
  }
  return grpc::Status::OK;
}

std::string CoreWorker::JobId() {
  if (opts_.is_driver) return opts_.job_id;
  std::lock_guard<std::mutex> lock(log_mu_);
  return current_job_;
}

std::string CoreWorker::GetNamespace() {
  if (opts_.is_driver) return opts_.ray_namespace;
  std::lock_guard<std::mutex> lock(log_mu_);
  return current_namespace_;
}

std::string CoreWorker::DriverAddress() {
  if (opts_.is_driver) return address_;
  std::lock_guard<std::mutex> lock(log_mu_);
  return current_driver_;
}

void CoreWorker::SetJobConfig(const std::string& serialized_runtime_env, rpc::TaskSpec* spec,
                              bool with_env) {
  auto own = internal::EnvVarsOfSerialized(serialized_runtime_env);
  std::unique_lock<std::mutex> lock(log_mu_, std::defer_lock);
  if (!opts_.is_driver) lock.lock();
  spec->set_default_detached(opts_.is_driver ? opts_.default_detached : current_default_detached_);
  if (!with_env) return;
  auto& env = *spec->mutable_env_vars();
  for (const auto& [k, v] : opts_.is_driver ? opts_.job_env_vars : current_env_vars_) env[k] = v;
  for (const auto& [k, v] : own) env[k] = v;
}

grpc::Status CoreWorker::PrintLogs(grpc::ServerContext* ctx, const rpc::LogBatch* req, rpc::Empty*) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  std::string prefix = "(worker " + req->worker_id().substr(0, 8) + " pid=" +
                       std::to_string(req->pid()) + " node=" + req->node_id().substr(0, 8) + ") ";
  std::string out, err;
  for (const auto& l : req->stdout_lines()) out += prefix + l + "\n";
  for (const auto& l : req->stderr_lines()) err += prefix + l + "\n";
  if (!out.empty()) (void)!write(STDOUT_FILENO, out.data(), out.size());
  if (!err.empty()) (void)!write(STDERR_FILENO, err.data(), err.size());
  return grpc::Status::OK;
}

void CoreWorker::CaptureOutput() {
  log_forwarder_ = std::make_unique<LogForwarder>(
      LogForwarder::Identity{opts_.worker_id, node_id_, opts_.token}, [this] { return DriverAddress(); });
  if (!log_forwarder_->Start()) TORUS_LOG(WARNING) << "cannot capture the worker's output";
}

grpc::Status CoreWorker::Exit(grpc::ServerContext* ctx, const rpc::Empty*, rpc::Empty*) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  exit_requested_ = true;
  return grpc::Status::OK;
}

grpc::Status CoreWorker::CheckLease(grpc::ServerContext* ctx, const rpc::CheckLeaseRequest* req,
                                    rpc::CheckLeaseReply* reply) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  if (!task_executor_) {  // a driver: no stream names any lease
    reply->set_use(rpc::CheckLeaseReply::REVOKED);
    return grpc::Status::OK;
  }
  switch (task_executor_->lease_use().Check(req->lease_id())) {
    case LeaseUse::Use::kInUse: reply->set_use(rpc::CheckLeaseReply::IN_USE); break;
    case LeaseUse::Use::kRevoked: reply->set_use(rpc::CheckLeaseReply::REVOKED); break;
    case LeaseUse::Use::kUndecided: reply->set_use(rpc::CheckLeaseReply::UNDECIDED); break;
  }
  return grpc::Status::OK;
}

grpc::Status CoreWorker::PushTasks(grpc::ServerContext* ctx,
                                   grpc::ServerReaderWriter<rpc::ResultBatch, rpc::TaskBatch>* stream) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  if (!task_executor_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "a driver does not run tasks");
  }
  return task_executor_->ServeTasks(stream);
}

// ------------------------------------------------------------------------------- TaskExecutor::Host

void CoreWorker::WaitReady() {
  std::unique_lock<std::mutex> lock(ready_mu_);
  ready_cv_.wait(lock, [this] { return ready_; });
}

void CoreWorker::EnterTask(const rpc::TaskSpec& spec) {
  std::lock_guard<std::mutex> lock(log_mu_);
  current_driver_ = spec.driver_address();
  current_job_ = spec.job_id();
  current_namespace_ = spec.ray_namespace();
  current_default_detached_ = spec.default_detached();
  if (spec.actor_creation() || spec.actor_id().empty()) {
    current_env_vars_ = {spec.env_vars().begin(), spec.env_vars().end()};
  }
}

std::shared_ptr<internal::Buffer> CoreWorker::GetOne(const std::string& id) {
  return Get({id}, -1)[0];
}

StatusOr<rpc::ObjectLocation> CoreWorker::StoreLarge(const rpc::TaskSpec& spec,
                                                     const std::string& bytes) {
  auto stored = CreateInStore(spec.return_id(),
                              HexOf(spec.return_id()) + ".r" + std::to_string(spec.attempt()),
                              bytes.size(), spec.owner_address());
  if (stored.ok()) internal::CopyLarge(arena_->data() + stored->offset(), bytes.data(), bytes.size());
  return stored;
}

void CoreWorker::ReportActorExit(const std::string& actor_id) {
  rpc::ActorWorkerDiedRequest req;
  req.set_actor_id(actor_id);
  req.set_worker_id(opts_.worker_id);
  req.set_intentional(true);
  req.set_description("the actor called ray::ExitActor()");
  rpc::Empty e;
  auto ctx = NewContext(opts_.token, 5000);
  (void)head_->ActorWorkerDied(ctx.get(), req, &e);
}

void CoreWorker::ReturnLease(const std::string& lease_id) {
  rpc::ReturnLeaseRequest req;
  req.set_lease_id(lease_id);
  rpc::Empty e;
  auto rctx = NewContext(opts_.token, 5000);
  (void)node_->ReturnLease(rctx.get(), req, &e);
}

}  // namespace torus::core
