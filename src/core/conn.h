// One outgoing PushTasks stream from the core worker to a leased worker or an actor: task specs
// go out in batches, results come back and are handed to the Listener (the core worker).
//
// The stream runs over the worker's lane (docs/wire.md) when it has one, else gRPC: a synchronous
// actor call is one message each way, and a gRPC stream message costs about twice the whole lane
// round trip.
//
// THREADS
//  - Enqueue/Flush/Close/Cancel/SetLease may be called from any thread (mu_ guards the send
//    queue). Flush writes on the caller's thread when asked to and the stream is idle (no
//    hand-off for synchronous calls), else wakes the writer thread, which sends everything
//    queued as one batch (natural batching under load).
//  - a reader thread calls Listener::OnResults for each result batch and, once the stream ends,
//    Listener::OnConnBroken exactly once. The constructor opens the stream; Start() starts both
//    threads, so the submitter first fills in its bookkeeping and attaches the Conn under its lock
//    (a stream that fails at once must not report to a submitter that does not know it yet).
//    Both threads are joined by Join() (and the destructor), which must not run on either.
//  - the public fields below the marker are the submitter's bookkeeping, guarded by its lock
//    (CoreWorker::mu_), not by mu_.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/task_record.h"
#include "proto/torus.pb.h"

namespace torus::core {

class TaskStream;

class Conn : public std::enable_shared_from_this<Conn> {
 public:
  // Receives what the stream brings back; called on the Conn's reader thread.
  class Listener {
   public:
    virtual ~Listener() = default;
    virtual void OnResults(Conn* conn, rpc::ResultBatch& batch) = 0;
    virtual void OnConnBroken(Conn* conn, const std::string& why) = 0;
  };

  // Opens the stream to `address`; no thread runs until Start().
  Conn(Listener* listener, std::string address, const std::string& token);
  ~Conn();
  // Starts the reader and writer threads. Once.
  void Start();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Queues tasks in order without writing or waking the writer: the submitter decides the order
  // under its own lock, then calls Flush() once it has released it, so no socket write happens
  // under the submitter's lock.
  void Enqueue(std::shared_ptr<TaskRecord> t);
  // Sends what is queued. `direct` is the caller's hint that nothing else is in flight (a
  // synchronous pattern): then the specs are written from this thread if the stream is idle (no
  // thread hand-off); otherwise the writer is woken and sends them as one batch.
  void Flush(bool direct);
  // Half-close: no more sends; the reader ends when the worker finishes.
  void Close();
  void Cancel();
  // Lets the worker give the lease back itself if this process dies mid-lease (sent with the
  // first batch).
  void SetLease(const std::string& lease_id);
  void Join();
  const std::string& address() const { return address_; }

  // Guarded by CoreWorker::mu_.
  std::string key, lease_id, worker_id, node_address, actor_id;
  std::unordered_map<uint64_t, std::shared_ptr<TaskRecord>> in_flight;  // by TaskCounterOf(task id)
  std::chrono::steady_clock::time_point idle_since = std::chrono::steady_clock::now();
  bool broken = false;
  bool returned = false;

 private:
  bool WriteSpecs(rpc::TaskBatch& batch, const std::shared_ptr<TaskRecord>* ts, size_t n);
  void WriteLoop();
  void ReadLoop();

  Listener* listener_;
  std::string address_;
  std::unique_ptr<TaskStream> stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<TaskRecord>> q_;  // guarded by mu_, and the flags below
  bool closing_ = false;
  bool writing_ = false;
  bool first_sent_ = false;
  std::string lease_id_for_worker_;
  std::thread reader_, writer_;
};

}  // namespace torus::core
