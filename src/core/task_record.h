// What the core worker's submitter keeps per task and per queue: the record of one submitted
// task (its spec, dependencies, pins, attempt state), the queue of normal tasks of one scheduling
// key with its leases, and the queue of one actor's calls.
//
// THREADS: plain data. Every field is read and written under CoreWorker::mu_, except a record's
// `spec`, which is not modified once the task was sent (a retry sends a copy) and may then be
// read by a Conn's writer without the lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/reference_counter.h"
#include "proto/torus.pb.h"

namespace torus::core {

class Conn;

// A task's retry limit from its options: negative means "retry forever", as in Ray.
inline int RetryLimit(int max_retries) {
  return max_retries < 0 ? std::numeric_limits<int>::max() : max_retries;
}

// "attempt N of M" for a log line, or "attempt N (retried forever)" when the limit is RetryLimit(-1).
inline std::string AttemptText(int attempt_number, int max_retries) {
  std::string s = "attempt " + std::to_string(attempt_number);
  if (max_retries == std::numeric_limits<int>::max()) return s + " (retried without limit)";
  return s + " of " + std::to_string(static_cast<int64_t>(max_retries) + 1);
}

// Whether `id` is one of the objects `spec` returns (its first, or one of num_returns).
inline bool IsReturnOf(const rpc::TaskSpec& spec, const std::string& id) {
  if (id == spec.return_id()) return true;
  for (int i = 1; i < spec.num_returns(); ++i) {
    if (id == ReturnIdOf(spec.return_id(), i)) return true;
  }
  return false;
}

// Task ids this process mints are NewObjectId()'s hex part: 16 hex of the worker id, then a
// 16-hex counter. The task table is keyed by that counter (no string key per task).
inline uint64_t TaskCounterOf(std::string_view task_id) {
  uint64_t v = 0;
  size_t start = task_id.size() >= 16 ? task_id.size() - 16 : 0;
  for (size_t i = start; i < task_id.size(); ++i) {
    char c = task_id[i];
    v = (v << 4) | static_cast<uint64_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
  }
  return v;
}

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
  std::string parent_task;         // the running task that submitted it (workers; recursive cancel)
  Conn* conn = nullptr;
  uint64_t stream_pos = 0;         // its position on `conn` (1-based, in the order sent)
  std::chrono::steady_clock::time_point sent_at;
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
  // A plain task's spec takes about 800 bytes of the arena with its cleanup list (1 KiB made the
  // arena take a 2 KiB heap block for every task).
  static constexpr size_t kBlockSize = 2048;
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
  bool spread = false;   // scheduling strategy SPREAD: one task per lease, leases spread out
};

struct ActorQueue {
  std::string actor_id;
  Conn* conn = nullptr;
  bool resolving = false;
  bool dead = false;
  std::string death_cause;
  // The worker whose connection broke last (set by DetachConn): resolving waits for the
  // head to place the actor elsewhere or declare it dead, not to hand this one out again.
  std::string lost_worker;
  uint64_t next_seq = 0;
  std::deque<std::shared_ptr<TaskRecord>> waiting;  // not sent yet, in submission order
};

}  // namespace torus::core
