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
//    Listener::OnConnBroken exactly once. A thread waiting for the reply of a synchronous call
//    may read the stream itself instead (ReadHere; see "Synchronous mode" below); one thread
//    reads at a time (rmu_), and results are handed over in the order they arrived. The constructor opens the stream; Start() starts both
//    threads, so the submitter first fills in its bookkeeping and attaches the Conn under its lock
//    (a stream that fails at once must not report to a submitter that does not know it yet).
//    Both threads are joined by Join() (and the destructor), which must not run on either.
//  - Synchronous mode (lane streams): one call in flight at a time, whose caller waits for its
//    reply. The reply would wake two threads, the reader and the caller; in this mode the
//    caller reads it off the socket itself (ReadHere) while the reader thread parks, so each
//    call wakes one thread. The mode starts when a caller asked to read while the reader was
//    reading; the reader parks only once nothing is in flight (OnResults says so), and a
//    caller leaves it parked on the same condition. It ends when any other kind of wait or send
//    shows up (Unpark, Flush(direct=false), Close, Cancel). A parked reader still wakes every
//    kParkMax to read what nobody asked for (a fire-and-forget call's reply, the end of the
//    stream), so that is late by at most kParkMax, never lost.
//  - the public fields below the marker are the submitter's bookkeeping, guarded by its lock
//    (CoreWorker::mu_), not by mu_.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
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
    // Returns whether nothing more is in flight on `conn` (its reader may then park).
    virtual bool OnResults(Conn* conn, rpc::ResultBatch& batch) = 0;
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
  // Reads the next result batch on the calling thread and hands it to the Listener there, if
  // the stream is a lane and no other thread is reading it (the reader thread stays parked).
  // `wanted` runs first, once this thread holds the read, without locks: false means the
  // caller's reply came meanwhile (nothing is read). Returns true when the caller should look
  // again for its reply; false when it should wait for the reader thread instead (another
  // thread reads, the stream ended, or nothing came within `slice`).
  bool ReadHere(const std::function<bool()>& wanted, std::chrono::milliseconds slice);
  // Whether ReadHere can work on this stream (a lane's; constant).
  bool CanReadHere() const;
  // Someone waits for this stream's results other than by ReadHere: the reader thread reads
  // again (leaves synchronous mode).
  void Unpark();
  // Half-close: no more sends; the reader ends when the worker finishes.
  void Close();
  void Cancel();
  // Lets the worker give the lease back itself if this process dies mid-lease (sent with the
  // first batch).
  void SetLease(const std::string& lease_id);
  // The next batch sent tells the worker to run tasks again, from stream position `from` on,
  // after it handed back the ones queued behind a blocked task (TaskBatch.resume_from). The
  // handed-back tasks' copies still in this Conn's queue are written anyway (positions must
  // stay in step) and skipped by the worker.
  void ResumeNext(uint64_t from);
  void Join();
  const std::string& address() const { return address_; }

  // Where the stream's tasks run, shared by the task table's rows (no string copies per task).
  struct Place {
    std::string worker_id, node_id;
  };

  // Guarded by CoreWorker::mu_.
  std::string key, lease_id, worker_id, node_address, node_id, actor_id;
  // worker_id and node_id as one shared Place, made on first use (they are set before any task
  // is sent and never change).
  const std::shared_ptr<const Place>& place() {
    if (!place_) place_ = std::make_shared<const Place>(Place{worker_id, node_id});
    return place_;
  }
  std::unordered_map<uint64_t, std::shared_ptr<TaskRecord>> in_flight;  // by TaskCounterOf(task id)
  uint64_t sent = 0;   // tasks assigned to this stream so far (their stream_pos)
  // The worker handed back the tasks queued behind a blocked one: nothing more goes to it until
  // the blocked task's result is back (then ResumeNext).
  bool held = false;
  std::chrono::steady_clock::time_point idle_since = std::chrono::steady_clock::now();
  bool broken = false;
  bool returned = false;

 private:
  bool WriteSpecs(rpc::TaskBatch& batch, const std::shared_ptr<TaskRecord>* ts, size_t n);
  // Requires mu_: the fields of the next batch besides its tasks (lease id, resume).
  void StartBatchLocked(rpc::TaskBatch& batch);
  void WriteLoop();
  void ReadLoop();
  // Requires rmu_: ends a park (the reader thread reads again).
  void UnparkLocked();

  Listener* listener_;
  std::string address_;
  std::unique_ptr<TaskStream> stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<TaskRecord>> q_;  // guarded by mu_, and the flags below
  bool closing_ = false;
  bool writing_ = false;
  bool first_sent_ = false;
  uint64_t resume_from_ = 0;  // ResumeNext()'s position; the next batch carries it
  std::string lease_id_for_worker_;
  std::thread reader_, writer_;
  std::shared_ptr<const Place> place_;  // guarded by CoreWorker::mu_ (place())

  // Who reads the stream (synchronous mode, above).
  static constexpr std::chrono::milliseconds kParkMax{20};
  std::mutex rmu_;
  std::condition_variable rcv_;  // the reader thread waits here while parked or while another reads
  bool reading_ = false;  // a thread is in stream_->Read; guarded by rmu_, as the flags below
  bool ended_ = false;    // the stream ended (the reader thread reports it)
  bool parked_ = false;   // the reader thread does not read (a caller does)
  bool sync_ = false;     // callers read their replies themselves
};

}  // namespace torus::core
