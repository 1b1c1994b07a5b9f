// Conn: see conn.h.
#include "core/conn.h"

#include "common/lane.h"
#include "common/rpc.h"
#include "core/task_executor.h"
#include "proto/torus.grpc.pb.h"

namespace torus::core {

// The PushTasks stream of a Conn: the lane's or gRPC's.
class TaskStream {
 public:
  virtual ~TaskStream() = default;
  virtual bool Write(const rpc::TaskBatch& b) = 0;
  virtual bool Read(rpc::ResultBatch* b) = 0;
  // 1: a message; 0: none within timeout_ms; -1: the end. Only where TimedReads().
  virtual int ReadWithin(rpc::ResultBatch*, int) { return -1; }
  virtual bool TimedReads() const { return false; }
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
  int ReadWithin(rpc::ResultBatch* b, int timeout_ms) override { return s_->ReadWithin(b, timeout_ms); }
  bool TimedReads() const override { return true; }
  void WritesDone() override { s_->WritesDone(); }
  grpc::Status Finish() override { return s_->Finish(); }
  void Cancel() override { s_->Cancel(); }

 private:
  std::unique_ptr<LaneClientStream> s_;
};

Conn::Conn(Listener* listener, std::string address, const std::string& token)
    : listener_(listener), address_(std::move(address)) {
  if (auto lane = LaneClientStream::Open(address_, token, kPushTasksMethod)) {
    stream_ = std::make_unique<LaneTaskStream>(std::move(lane));
  } else {
    stream_ = std::make_unique<GrpcTaskStream>(address_, token);
  }
}

void Conn::Start() {
  reader_ = std::thread([this] { ReadLoop(); });
  writer_ = std::thread([this] { WriteLoop(); });
}

Conn::~Conn() { Join(); }

void Conn::Enqueue(std::shared_ptr<TaskRecord> t) {
  std::lock_guard<std::mutex> lock(mu_);
  q_.push_back(std::move(t));
}

void Conn::Flush(bool direct) {
  if (!direct) {
    std::lock_guard<std::mutex> r(rmu_);
    sync_ = false;
    UnparkLocked();
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (q_.empty()) return;
  if (!direct || writing_ || closing_) {
    cv_.notify_one();
    return;
  }
  writing_ = true;
  rpc::TaskBatch batch;
  StartBatchLocked(batch);
  std::vector<std::shared_ptr<TaskRecord>> sending(std::make_move_iterator(q_.begin()),
                                                   std::make_move_iterator(q_.end()));
  q_.clear();
  lock.unlock();
  bool ok = WriteSpecs(batch, sending.data(), sending.size());
  lock.lock();
  writing_ = false;
  if (!ok) stream_->Cancel();
  // Only when the writer has something to do: waking it for nothing costs a thread switch
  // on every synchronous call.
  if (!q_.empty() || closing_) cv_.notify_one();
}

void Conn::Close() {
  {
    std::lock_guard<std::mutex> r(rmu_);
    sync_ = false;
    UnparkLocked();
  }
  std::lock_guard<std::mutex> lock(mu_);
  closing_ = true;
  cv_.notify_one();
}

void Conn::SetLease(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  lease_id_for_worker_ = lease_id;
}

void Conn::ResumeNext(uint64_t from) {
  std::lock_guard<std::mutex> lock(mu_);
  resume_from_ = from;
}

void Conn::StartBatchLocked(rpc::TaskBatch& batch) {
  if (!first_sent_) {
    batch.set_lease_id(lease_id_for_worker_);
    first_sent_ = true;
  }
  if (resume_from_) {
    batch.set_resume_from(resume_from_);
    resume_from_ = 0;
  }
}

void Conn::Join() {
  Close();
  if (writer_.joinable()) writer_.join();
  if (reader_.joinable()) reader_.join();
}

// The specs go out as one TaskBatch without being copied: the batch borrows each record's spec
// for the Write and gives it back. A spec is not modified once sent (a retry sends a copy).
bool Conn::WriteSpecs(rpc::TaskBatch& batch, const std::shared_ptr<TaskRecord>* ts, size_t n) {
  auto* tasks = batch.mutable_tasks();
  tasks->Reserve(static_cast<int>(n));
  for (size_t i = 0; i < n; ++i) tasks->UnsafeArenaAddAllocated(&ts[i]->spec);
  bool ok = stream_->Write(batch);
  tasks->UnsafeArenaExtractSubrange(0, tasks->size(), nullptr);
  return ok;
}

void Conn::WriteLoop() {
  std::vector<std::shared_ptr<TaskRecord>> sending;
  while (true) {
    rpc::TaskBatch batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return (!q_.empty() || closing_) && !writing_; });
      if (q_.empty()) break;
      writing_ = true;
      StartBatchLocked(batch);
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

void Conn::ReadLoop() {
  rpc::ResultBatch batch;
  std::unique_lock<std::mutex> lock(rmu_);
  while (true) {
    while (!ended_ && (reading_ || parked_)) {
      if (rcv_.wait_for(lock, kParkMax) == std::cv_status::timeout && !reading_) {
        parked_ = false;  // nobody came for the reply: read it
      }
    }
    if (ended_) break;
    reading_ = true;
    lock.unlock();
    bool ok = stream_->Read(&batch);
    bool idle = false;
    if (ok) {
      idle = listener_->OnResults(this, batch);
      batch.Clear();
    }
    lock.lock();
    reading_ = false;
    if (!ok) {
      ended_ = true;
      break;
    }
    // A caller wants to read the replies of its synchronous calls itself.
    if (sync_ && idle) parked_ = true;
  }
  lock.unlock();
  auto st = stream_->Finish();
  listener_->OnConnBroken(this, st.ok() ? "stream closed" : st.error_message());
}

bool Conn::CanReadHere() const { return stream_->TimedReads(); }

bool Conn::ReadHere(const std::function<bool()>& wanted, std::chrono::milliseconds slice) {
  if (!CanReadHere()) return false;
  {
    std::lock_guard<std::mutex> r(rmu_);
    if (ended_) return false;
    sync_ = true;  // also when the reader is busy: it parks after it, once nothing is in flight
    if (reading_) return false;
    reading_ = true;
    parked_ = true;
  }
  int got = -2;  // an exception below: the reader thread reads again
  bool idle = false;
  struct Release {
    Conn* c;
    const int& got;
    const bool& idle;
    ~Release() {
      std::lock_guard<std::mutex> r(c->rmu_);
      c->reading_ = false;
      if (got == -1) c->ended_ = true;  // the reader thread reports the end
      // Nothing came in time, or more is in flight: the reader thread reads again.
      if (got != 1 || !idle) c->parked_ = false;
      if (!c->parked_ || c->ended_) c->rcv_.notify_one();
    }
  } release{this, got, idle};
  if (!wanted()) {
    got = 1;  // its reply came meanwhile
    return true;
  }
  // Whatever comes is handed over here, in order: the reader thread does not read meanwhile.
  thread_local rpc::ResultBatch batch;
  int r = stream_->ReadWithin(&batch, static_cast<int>(std::max<int64_t>(slice.count(), 1)));
  if (r > 0) {
    idle = listener_->OnResults(this, batch);
    batch.Clear();
  }
  got = r;
  return got > 0;
}

void Conn::Unpark() {
  std::lock_guard<std::mutex> r(rmu_);
  sync_ = false;
  UnparkLocked();
}

void Conn::UnparkLocked() {
  if (!parked_) return;
  parked_ = false;
  rcv_.notify_one();
}

void Conn::Cancel() {
  stream_->Cancel();
  Unpark();
}

}  // namespace torus::core
