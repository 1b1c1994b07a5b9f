// A client's remembered lane port may come to belong to another process (the peer died and its
// port was taken again, e.g. by a worker's lane): the hello names the gRPC port the client
// meant, that lane refuses, and the call goes to the right server over gRPC instead of being
// answered "no method" (or served) by the wrong process.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/lane.h"
#include "common/rpc.h"

namespace torus {
namespace {

constexpr char kToken[] = "lane-identity-token";

// A process's gRPC server with its lane; the lane also serves Lane.Where, so a call says which
// lane (or gRPC) answered by the port in the reply.
struct Peer {
  explicit Peer(const std::string& what) : lane(kToken, what) {
    lane.Handle("/torus.rpc.Lane/Where", &lane, &rpc::Lane::Service::Where);
    EXPECT_GT(lane.Start("127.0.0.1"), 0);
    server = StartServer("127.0.0.1", &port, {&lane});
    EXPECT_TRUE(server);
    lane.SetGrpcPort(port);
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~Peer() {
    if (server) server->Shutdown();
    lane.Stop();
  }
  LaneServer lane;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string address;
};

uint32_t AskWhere(const std::string& address) {
  rpc::LaneWhereReply reply;
  grpc::Status st = LaneUnary(address, kToken, 5000, "/torus.rpc.Lane/Where", &rpc::Lane::Service::Where,
                              &rpc::Lane::Stub::Where, rpc::Empty(), &reply);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return reply.port();
}

TEST(LaneIdentityTest, ALaneThatBelongsToAnotherServerIsRefusedAndTheCallGoesToTheRightOne) {
  Peer head("head"), worker("worker w1");
  // The client remembers the worker's lane port for the head's address (as after the head's
  // lane port was taken by the worker's lane when the head restarted).
  NoteLane(head.address, worker.lane.port(), "");
  EXPECT_EQ(AskWhere(head.address), static_cast<uint32_t>(head.lane.port()));  // via gRPC, not the worker
  // The stale port was forgotten: the head's lane is learned again.
  EXPECT_TRUE(HasLane(head.address, kToken));
  EXPECT_EQ(AskWhere(head.address), static_cast<uint32_t>(head.lane.port()));
  // A hello for the worker's own gRPC port is still accepted by its lane.
  EXPECT_EQ(AskWhere(worker.address), static_cast<uint32_t>(worker.lane.port()));
}

}  // namespace
}  // namespace torus
