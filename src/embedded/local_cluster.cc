// The embedded default cluster: a private head and node inside the driver process, in a session
// of their own. Registers itself as core's EmbeddedClusterStarter while libtorus.so loads
// (core/embedded_cluster.h), so core/ never links head/ or node/.
//
// Threading: Start and Stop are called by ray::Init()/Shutdown() under the API's process lock,
// one at a time; the head and node own their threads and join them in Stop().
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "common/session.h"
#include "core/embedded_cluster.h"
#include "embedded/head_args.h"
#include "head/head.h"
#include "node/node.h"
#include "torus/api/exceptions.h"

namespace torus::embedded {

namespace {

using internal::RayException;

std::string FindTorusBinary() {
  if (const char* e = std::getenv("TORUS_BIN"); e && *e) return e;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&FindTorusBinary), &info) && info.dli_fname) {
    namespace fs = std::filesystem;
    fs::path lib = fs::weakly_canonical(info.dli_fname).parent_path();
    // Build tree, `cmake --install` prefix, the Python wheel (torus/_bin/torus).
    for (auto p : {lib / "torus", lib.parent_path() / "bin" / "torus", lib / "_bin" / "torus"}) {
      if (access(p.c_str(), X_OK) == 0) return p.string();
    }
  }
  return "torus";
}

class LocalCluster final : public core::EmbeddedCluster {
 public:
  ~LocalCluster() override { Stop(); }

  const std::string& head_address() const override { return head_address_; }
  const std::string& node_address() const override { return node_address_; }
  const std::string& token() const override { return token_; }

  void Stop() override {
    if (node_) node_->Stop();
    if (head_) head_->Stop();
    node_.reset();
    head_.reset();
    if (!session_.empty() && !std::getenv("TORUS_KEEP_SESSION")) {
      std::error_code ec;
      std::filesystem::remove_all(session_, ec);
    }
    session_.clear();
  }

  // Throws RayException; on failure the destructor stops what started and removes the session.
  void Start(const core::EmbeddedClusterOptions& options) {
    NodeConfig nc;
    ApplyHeadArgs(options.head_args, &nc);  // before anything starts: may throw
    auto session = CreateSession(/*make_latest=*/false);
    if (!session.ok()) throw RayException(session.status().ToString());
    auto tok = ReadTokenFile(*session);  // the new session's own token, whatever TORUS_TOKEN says
    if (!tok.ok()) throw RayException(tok.status().ToString());
    token_ = *tok;
    session_ = *session;
    if (!options.logs_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(options.logs_dir, ec);
      if (ec) throw RayException("--ray_logs_dir " + options.logs_dir + ": " + ec.message());
      nc.logs_dir = options.logs_dir;
    }
    HeadConfig hc;
    hc.session_dir = session_;
    hc.token = token_;
    head_ = std::make_unique<Head>(hc);
    if (auto s = head_->Start(); !s.ok()) {
      throw RayException("cannot start the embedded head: " + s.ToString());
    }
    head_address_ = head_->address();
    nc.head_address = head_address_;
    nc.session_dir = session_;
    nc.token = token_;
    nc.torus_exe = FindTorusBinary();
    node_ = std::make_unique<Node>(nc);
    if (auto s = node_->Start(); !s.ok()) {
      throw RayException("cannot start the embedded node: " + s.ToString());
    }
    node_address_ = node_->address();
  }

 private:
  std::unique_ptr<Head> head_;
  std::unique_ptr<Node> node_;
  std::string session_;
  std::string token_;
  std::string head_address_;
  std::string node_address_;
};

std::unique_ptr<core::EmbeddedCluster> StartLocalCluster(
    const core::EmbeddedClusterOptions& options) {
  auto cluster = std::make_unique<LocalCluster>();
  cluster->Start(options);  // on a throw, ~LocalCluster stops what started
  return cluster;
}

[[maybe_unused]] const bool registered = (core::SetEmbeddedClusterStarter(&StartLocalCluster), true);

}  // namespace

}  // namespace torus::embedded
