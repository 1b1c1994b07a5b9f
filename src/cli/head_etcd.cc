#include "cli/head_etcd.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <iostream>

#include "cli/daemon_threads.h"
#include "cli/start.h"
#include "common/logging.h"
#include "common/session.h"
#include "common/tcp_relay.h"
#include "head/head_election.h"

namespace torus {

std::string HeadStateFile(const std::string& session, int port) {
  return session + "/head_" + std::to_string(port) + ".state";
}

namespace {

// The session's token file takes the cluster's token from etcd (the first head wrote its own).
void AdoptClusterToken(HeadElection& election, HeadConfig* cfg) {
  auto token = election.ClusterToken(cfg->token);
  if (!token.ok()) Die("--state " + cfg->state_path + ": " + token.status().message());
  if (*token == cfg->token) return;
  TORUS_LOG(INFO) << "taking the cluster token kept in " << cfg->state_path;
  cfg->token = *token;
  if (!cfg->session_dir.empty()) {
    if (auto s = WriteFile(cfg->session_dir + "/token", *token, 0600); !s.ok()) Die(s.message());
  }
}

}  // namespace

int RunHeadOnEtcd(const Args& a, HeadConfig cfg, const sigset_t& signals) {
  if (cfg.port == 0) Die("a head on etcd needs a fixed --port: its standbys' callers dial it");
  if (cfg.bind_host == "0.0.0.0" || cfg.bind_host == "::") {
    Die("a head on etcd announces its --bind address to the other heads and the nodes: give this "
        "host's address, not " + cfg.bind_host);
  }
  const std::string address = cfg.bind_host + ":" + std::to_string(cfg.port);
  const std::string state_file = HeadStateFile(cfg.session_dir, cfg.port);
  auto election = HeadElection::Connect({cfg.state_path, address});
  if (!election.ok()) Die(election.status().message());
  AdoptClusterToken(**election, &cfg);

  // Standing by: callers of this address reach the active head through the relay.
  TcpRelay relay;
  if (auto port = relay.Start(cfg.ListenHost(), cfg.port); !port.ok()) Die(port.status().message());
  std::atomic<Head*> serving{nullptr};
  std::atomic<bool> stop{false};
  SignalThread on_signal(signals, [&] {
    stop = true;
    // Stop serving first, then hand the leadership over (revoking the lease): a standby must
    // not start while this head still answers.
    if (Head* h = serving.load()) h->Stop();
    (*election)->Stop();  // ends the campaign, or hands the leadership over at once
  });
  auto campaign = (*election)->Campaign([&](const std::string& active) {
    relay.SetUpstream(active == address ? "" : active);  // our own stale key: wait for it to expire
    if (!cfg.session_dir.empty()) (void)WriteFile(state_file, "standby " + active);
  });
  relay.Stop();
  if (!campaign.ok() || stop) return 0;
  (*election)->OnLost([address](const std::string& why) {
    // Another head may be active already: stop serving now, without a word to the nodes.
    std::cerr << "torus head " << address << ": lost the leadership (" << why << "); exiting" << std::endl;
    _exit(3);
  });

  // Active: the state is ours (fenced by the leader key); serve it on the relay's port.
  auto store = (*election)->OpenStore();
  if (!store.ok()) {
    (*election)->Stop();  // a standby takes over now, not after the lease's TTL
    Die(store.status().message());
  }
  cfg.store = std::shared_ptr<HeadStore>(std::move(*store));
  Head head(cfg);
  if (auto s = head.Start(); !s.ok()) {
    (*election)->Stop();
    Die(s.ToString());
  }
  (*election)->OnHeads([&head](const std::vector<std::string>& heads) { head.SetHeadAddresses(heads); });
  serving = &head;
  if (stop) head.Stop();
  if (auto s = WriteHeadAddresses(head, cfg.session_dir); !s.ok()) {
    head.Stop();
    (*election)->Stop();
    Die(s.message());
  }
  if (!cfg.session_dir.empty()) (void)WriteFile(state_file, "active");
  head.Wait();
  serving = nullptr;
  (*election)->Stop();
  return 0;
}

}  // namespace torus
