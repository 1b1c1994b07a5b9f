// EtcdProcess: a throwaway single-member etcd for tests: the `etcd` program found on PATH (etcd
// 3.4+, Debian's etcd-server; scripts/deps.sh installs it), on free loopback ports, with its data
// in a fresh directory under /tmp.
//
//   EtcdProcess etcd;
//   etcd.Start();                      // returns once etcd answers (EtcdClient::Connect)
//   auto client = torus::EtcdClient::Connect(etcd.endpoint());
//   ...
//   etcd.Kill();                       // SIGKILL, and the data directory removed (so does ~)
//
// Start() throws std::runtime_error saying why when etcd is not on PATH or does not come up (with
// the end of its log): a test that needs etcd fails, it is not skipped. The etcd process gets
// SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG): a test process that crashes
// leaves no etcd behind.
//
// Thread safety: none; call from one thread (the one whose end may end etcd).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace torus_test {

class EtcdProcess {
 public:
  EtcdProcess() = default;
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // Starts etcd and waits (up to 30 s) until it serves reads. Throws std::runtime_error.
  void Start();
  // "127.0.0.1:<port>": etcd's client endpoint (empty before Start).
  const std::string& endpoint() const { return endpoint_; }
  pid_t pid() const { return pid_; }
  // etcd's output so far (stdout and stderr), for failure messages.
  std::string Log() const;
  // SIGKILLs etcd, reaps it and removes its data directory. Idempotent.
  void Kill();

 private:
  // One try on fresh ports: true when etcd serves; false when it exited (e.g. a port was taken
  // meanwhile); throws when it neither serves nor exits in time.
  bool TryStart(const std::string& etcd);

  std::string dir_;       // the data directory's parent: data/ and etcd.log inside
  std::string endpoint_;
  pid_t pid_ = 0;
};

// EtcdCluster: a throwaway etcd cluster of `n` members (3 by default) on loopback ports, each with
// its own data directory, for tests of what a client does when a member dies. Same rules as
// EtcdProcess (found on PATH, SIGKILL when the starting thread ends, throws when it cannot start).
class EtcdCluster {
 public:
  EtcdCluster() = default;
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Starts every member and waits (up to 30 s) until the cluster serves reads.
  void Start(int n = 3);
  // "127.0.0.1:p1,127.0.0.1:p2,...": every member's client endpoint, in order.
  const std::string& endpoints() const { return endpoints_; }
  const std::string& endpoint(int i) const { return members_[i].endpoint; }
  // SIGKILLs member i (its data stays until the cluster goes). Idempotent.
  void Kill(int i);

 private:
  struct Member {
    std::string endpoint;
    pid_t pid = 0;
  };
  std::string dir_;
  std::string endpoints_;
  std::vector<Member> members_;
};

}  // namespace torus_test
