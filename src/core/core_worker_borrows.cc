// CoreWorker's side of the borrow protocol (docs/objects.md): registering with owners, pinning
// task arguments, sending releases, probing borrowers; the counting itself is ReferenceCounter's.

#include "core/core_worker.h"

#include <cxxabi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common/env_key.h"
#include "common/ids.h"
#include "common/labels.h"
#include "common/lane.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/thread_annotations.h"
#include "common/work_queue.h"
#include "core/conn.h"
#include "core/log_forwarder.h"
#include "core/task_record.h"
#include "tpu/chip_visibility.h"
#include "torus/api/exceptions.h"
#include "torus/api/runtime_env.h"
#include "torus/api/serializer.h"

namespace torus::core {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

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
                                       google::protobuf::RepeatedPtrField<std::string>* registered) {
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
      registered->Add(std::string(id));
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
      if (!unknown.count(id)) registered->Add(std::string(id));
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

}  // namespace torus::core
