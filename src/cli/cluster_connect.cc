#include "cli/cluster_connect.h"

#include <filesystem>

#include "common/rpc.h"
#include "common/session.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

Cluster Connect(const Args& a) {
  Cluster c;
  bool from_session = false;
  c.address = ResolveAddress(a, &from_session);
  if (c.address.empty()) Die("no cluster: pass --address, set TORUS_ADDRESS, or run torus start --head");
  const std::string session = from_session ? LatestSession() : "";
  if (from_session && std::filesystem::exists(session + "/launcher/down")) {
    Die("no Torus cluster is running: the latest one (" + session +
        ") was stopped by torus down; start one with torus start --head or torus up");
  }
  auto tok = FindToken();
  if (!tok.ok()) Die(tok.status().message());
  c.token = *tok;
  auto stub = rpc::Head::NewStub(GetChannel(c.address));
  auto ctx = NewContext(c.token, 5000);
  auto st = stub->List(ctx.get(), rpc::Empty(), &c.list);
  if (!st.ok() && from_session && st.error_code() == grpc::StatusCode::UNAVAILABLE) {
    Die("no Torus cluster is running: the head of the latest session (" + session + ", " + c.address +
        ") does not answer; start one with torus start --head, or pass --address");
  }
  if (!st.ok()) Die("cannot reach the head at " + c.address + ": " + st.error_message());
  return c;
}

}  // namespace torus
