// TcpRelay: a standby head's port (head/head_election.h). Every connection accepted on it is
// joined, byte for byte, to a new connection to the upstream address (the active head), so a
// node, driver or CLI given a standby's address reaches the active head with any protocol
// (gRPC, the lane's Where, HTTP) and nothing to learn. Changing the upstream closes the joined
// connections (they led to a head that is no longer active); Stop closes everything, after which
// the port can be bound again (the standby becoming active serves on it).
//
// THREADS: one owned thread polls the listener and every joined pair; Start, SetUpstream and
// Stop may be called from any thread (mu_ guards the upstream; the thread owns the sockets).
// A wake pipe cuts the poll short.
#pragma once

#include <atomic>
#include <string>
#include <thread>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace torus {

class TcpRelay {
 public:
  TcpRelay() = default;
  ~TcpRelay() { Stop(); }
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  // Listens on host:port (0: any; the port is returned) and starts relaying to the upstream set
  // (connections accepted while there is none are closed).
  StatusOr<int> Start(const std::string& host, int port) EXCLUDES(mu_);
  void SetUpstream(const std::string& address) EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);
  // Connections joined so far (for tests and logs).
  int64_t joined() const { return joined_.load(); }

 private:
  struct Pair;
  void Loop();

  Mutex mu_;
  std::string upstream_ GUARDED_BY(mu_);
  uint64_t generation_ GUARDED_BY(mu_) = 0;  // bumped by SetUpstream: older pairs close
  bool stop_ GUARDED_BY(mu_) = false;
  int listen_fd_ = -1;  // set by Start, closed by the thread's end
  int wake_[2] = {-1, -1};
  std::atomic<int64_t> joined_{0};
  std::thread thread_;
};

}  // namespace torus
