// ActorStarter: starts an actor on this node (Node.StartActor, called by the head): reserves
// its resources from the ledger or its placement-group bundle (none are held while it lives
// when it asked for none), takes an idle worker of its key, else a warm one still starting
// (WorkerPool::ClaimStarting; the node starts warm workers again later), else starts one dedicated
// to it (task leases never take that one meanwhile) and waits up to 60 s for it to register, then
// runs the constructor over a PushTasks stream and answers with the worker's address. A
// constructor that fails kills the worker (its resources come back through the reaper).
//
// Asked again for an actor this node already hosts (the head restarted while the first call
// ran: docs/fault_tolerance.md), it waits for that worker's constructor and answers with it
// instead of starting a second instance.
//
// THREADS: shares the node's mutex (NodeState::mu; node/node_state.h). Start runs on a gRPC
// handler thread and blocks: on NodeState::cv while the worker starts, then on the constructor
// call, which runs without the lock.
#pragma once

#include <string>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "node/node_state.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

class ActorStarter {
 public:
  // `st` and `token` (the cluster's) outlive this.
  ActorStarter(NodeState& st, const std::string& token) : st_(st), token_(token) {}
  ActorStarter(const ActorStarter&) = delete;
  ActorStarter& operator=(const ActorStarter&) = delete;

  // Starts the actor; errors go into reply->error (the RPC itself succeeds).
  void Start(const rpc::StartActorRequest& req, rpc::StartActorReply* reply) EXCLUDES(st_.mu);

 private:
  // The worker of a new actor (an idle one of its key, else a fresh one, waited for up to
  // 60 s), or null with reply's error set (its hold then given back).
  Worker* WorkerLocked(MutexLock& lock, const rpc::StartActorRequest& req, const std::string& key,
                       Hold& hold, rpc::StartActorReply* reply) REQUIRES(st_.mu);
  // The outcome of an earlier start of the same actor on this node: true (reply filled) when
  // its worker is alive and its constructor returned; false when there is no such worker (or it
  // ended), so the actor is started anew. Waits while that constructor runs.
  bool AnswerFromExistingLocked(MutexLock& lock, const std::string& actor_id, rpc::StartActorReply* reply)
      REQUIRES(st_.mu);
  // Waits (up to 60 s) for worker `id`, reserved for this actor, to register; null with reply's
  // error set (its hold given back) when it exits or does not register in time.
  Worker* WaitRegistered(MutexLock& lock, std::string id, Hold& hold, rpc::StartActorReply* reply)
      REQUIRES(st_.mu);
  // Gives `hold` back and sets reply's error; null.
  Worker* Fail(Hold& hold, rpc::StartActorReply* reply, StatusCode code, const std::string& why)
      REQUIRES(st_.mu);
  // Runs the actor's constructor on its worker (no lock held), filling reply.
  void RunConstructor(const rpc::StartActorRequest& req, const std::string& worker_id,
                      const std::string& worker_address, rpc::StartActorReply* reply) EXCLUDES(st_.mu);

  NodeState& st_;
  const std::string& token_;
};

}  // namespace torus
