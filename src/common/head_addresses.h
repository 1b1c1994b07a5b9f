// HeadAddresses: the heads of a cluster as a client knows them — the address it was given
// ("host:port", or several separated by commas) and those the heads announce (the active head
// first, then its standbys: head/head_election.h) — and the one it calls now. A client whose
// calls to the current head fail as unreachable moves to the next address; a standby relays to
// the active head, so any live head's address reaches it.
//
// THREADS: every method may be called from any thread (mu_).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/thread_annotations.h"

namespace torus {

class HeadAddresses {
 public:
  explicit HeadAddresses(const std::string& given);

  std::string current() const EXCLUDES(mu_);
  // Calls to `failed` could not reach it: when it is still current, the next known address
  // becomes current. Returns the current address.
  std::string Failed(const std::string& failed) EXCLUDES(mu_);
  // The heads' own list (active first): the active becomes current; addresses given and not
  // announced stay known (after the announced ones).
  void Learn(const std::vector<std::string>& heads, uint64_t version) EXCLUDES(mu_);
  // The version of the last list learnt (0: none), as HeartbeatRequest.heads_version.
  uint64_t version() const EXCLUDES(mu_);
  // Every known address, current first, joined by commas (for a child process's environment).
  std::string joined() const EXCLUDES(mu_);

  // The version of a list of heads (as the head computes it for its replies); never 0.
  static uint64_t VersionOf(const std::vector<std::string>& heads);
  // "a,b" -> {"a", "b"} (empty parts dropped).
  static std::vector<std::string> Split(const std::string& list);

 private:
  mutable Mutex mu_;
  std::vector<std::string> all_ GUARDED_BY(mu_);  // never empty
  size_t current_ GUARDED_BY(mu_) = 0;
  uint64_t version_ GUARDED_BY(mu_) = 0;
};

}  // namespace torus
