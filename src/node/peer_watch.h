// PeerWatch: this node's place in the watch ring (docs/fault_tolerance.md, "Finding dead
// nodes"). The head gives every alive node a target, the next alive node in its node order
// (RegisterNodeReply.watch, HeartbeatReply.watch, Node.SetWatch); the node holds one lane
// stream (Node/Watch) open to it, silent, with TCP keepalive. When the stream ends (the target's
// process died: its kernel closes the socket at once; its host vanished: keepalive finds it
// within about 2 s) or cannot be opened, `lost` is called for that episode (again, with the
// backoff, until it returns true: the head was told) and the node tells the head
// (Head.ReportPeerLost), which probes the target and declares it dead if it does not answer.
// The stream is then opened again with backoff (200 ms doubling to 1 s): a target that comes
// back, or never left, is watched again (a link counts once the target acknowledged the hello),
// and a later loss is told again.
//
// So no one, the head included, does periodic work per node to find a dead one: a death costs
// one report and one probe, at any cluster size.
//
// THREADS: owns one thread, started by the constructor (it sleeps until a target is set) and
// joined by Stop() (idempotent; also the destructor; one caller at a time). SetTarget and
// watching() from any thread; `lost` runs on the watch thread with no lock of this class held.
// mu_ guards the target and the open stream.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "common/lane.h"
#include "common/thread_annotations.h"
#include "proto/torus.pb.h"

namespace torus {

inline constexpr char kWatchMethod[] = "/torus.rpc.Node/Watch";

class PeerWatch {
 public:
  // Tells the head; true once it was told.
  using Lost = std::function<bool(const std::string& node_id, const std::string& how)>;
  PeerWatch(std::string token, std::string my_id, Lost lost);
  ~PeerWatch() { Stop(); }
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // The node to watch from now on (node_id "": none). The same target again changes nothing.
  void SetTarget(const rpc::WatchTarget& t) EXCLUDES(mu_);
  // The node watched now ("" none), for HeartbeatRequest.watching.
  std::string watching() const EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);

 private:
  void Run() EXCLUDES(mu_);
  // Holds a stream to t until it ends or is cancelled; "" when cancelled (a new target, Stop),
  // else how it ended (or why it could not be opened).
  std::string Hold(const rpc::WatchTarget& t, uint64_t version, bool* linked) EXCLUDES(mu_);

  const std::string token_, my_id_;
  const Lost lost_;
  std::thread thread_;
  mutable Mutex mu_;
  CondVar cv_;
  rpc::WatchTarget target_ GUARDED_BY(mu_);
  uint64_t version_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  LaneClientStream* stream_ GUARDED_BY(mu_) = nullptr;  // the open one, to Cancel
};

}  // namespace torus
