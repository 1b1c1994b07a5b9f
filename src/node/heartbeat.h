// Heartbeat: the node's beat to the head. Every period (the longer of the node's heartbeat_ms
// and the pacing the head asks for) it has the node fill a HeartbeatRequest, sends it
// (Head.Heartbeat, 2 s deadline; over the head's lane when it has one, else gRPC) and hands a
// successful reply back to the node. After head_lost_ms without a successful beat (the head
// refuses the token or cannot be reached) it calls give_up once and ends.
//
// THREADS: owns one thread (a PeriodicThread), stopped and joined by Stop() or the destructor;
// give_up runs on that thread and may call Stop() (which then does not join; the destructor
// does). The hooks run on that thread with no lock of this class held. The head's pacing is
// an atomic, set from any thread (registration, a reply).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/head_addresses.h"
#include "common/periodic_thread.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

class Heartbeat {
 public:
  struct Config {
    // The head (and its standbys): a beat that cannot reach the current one moves to the next;
    // a reply's list of heads is learnt.
    std::shared_ptr<HeadAddresses> heads;
    std::string token;
    int heartbeat_ms = 100;   // the node's own period (the shortest)
    int head_lost_ms = 30000;  // give up after this long without a successful beat
  };
  struct Hooks {
    // Fills the request (its period is set already). False: the node is stopping, end.
    std::function<bool(rpc::HeartbeatRequest* req)> fill;
    // A successful reply to `req`.
    std::function<void(const rpc::HeartbeatRequest& req, const rpc::HeartbeatReply& reply)> apply;
    // No successful beat for head_lost_ms; `last` is the last failure.
    std::function<void(const grpc::Status& last)> give_up;
  };

  Heartbeat(Config cfg, Hooks hooks);
  ~Heartbeat() { Stop(); }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  void Start();
  void Stop() { thread_.Stop(); }
  // The head's pacing (RegisterNodeReply/HeartbeatReply.heartbeat_ms; 0 = none).
  void SetHeadPacing(uint32_t ms) { head_ms_ = ms; }
  int period_ms() const;

 private:
  // One beat; the delay to the next, or nullopt to end.
  std::optional<std::chrono::milliseconds> Beat();

  // constant after construction
  const Config cfg_;
  const Hooks hooks_;
  std::atomic<uint32_t> head_ms_{0};
  // only the heartbeat thread touches these
  int failures_ = 0;
  std::chrono::steady_clock::time_point last_ok_;
  PeriodicThread thread_;
};

}  // namespace torus
