#include "node/heartbeat.h"

#include <algorithm>
#include <utility>

#include "common/lane.h"
#include "common/logging.h"

namespace torus {

Heartbeat::Heartbeat(Config cfg, Hooks hooks) : cfg_(std::move(cfg)), hooks_(std::move(hooks)) {}

int Heartbeat::period_ms() const {
  return std::max<int>(cfg_.heartbeat_ms, static_cast<int>(head_ms_.load()));
}

void Heartbeat::Start() {
  last_ok_ = std::chrono::steady_clock::now();
  thread_.Start(std::chrono::milliseconds(0), [this] { return Beat(); });
}

std::optional<std::chrono::milliseconds> Heartbeat::Beat() {
  rpc::HeartbeatRequest req;
  req.set_heartbeat_ms(static_cast<uint32_t>(period_ms()));
  if (!hooks_.fill(&req)) return std::nullopt;
  req.set_heads_version(cfg_.heads->version());
  rpc::HeartbeatReply reply;
  // Over the head's lane when it has one: a gRPC heartbeat cost the two processes together
  // several times the CPU, and 64 nodes send 640 a second.
  const std::string head = cfg_.heads->current();
  auto st = LaneUnary(head, cfg_.token, 2000, "/torus.rpc.Head/Heartbeat", &rpc::Head::Service::Heartbeat,
                      &rpc::Head::Stub::Heartbeat, req, &reply);
  if (!st.ok()) {
    if (++failures_ % 50 == 1) {
      TORUS_LOG(WARNING) << "heartbeat to head " << head << " failed: " << st.error_message();
    }
    if (std::chrono::steady_clock::now() - last_ok_ >= std::chrono::milliseconds(cfg_.head_lost_ms)) {
      hooks_.give_up(st);
      return std::nullopt;
    }
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE || st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      // Gone or unreachable: a standby (if any is known) is tried next, soon.
      if (cfg_.heads->Failed(head) != head) return std::chrono::milliseconds(std::min(period_ms(), 200));
    }
  } else {
    failures_ = 0;
    last_ok_ = std::chrono::steady_clock::now();
    head_ms_ = reply.heartbeat_ms();
    if (reply.head_addresses_size() > 0) {
      cfg_.heads->Learn({reply.head_addresses().begin(), reply.head_addresses().end()}, reply.heads_version());
    }
    hooks_.apply(req, reply);
  }
  // One timed wait, not 10 ms naps: an idle node should not wake 100 times a second.
  return std::chrono::milliseconds(period_ms());
}

}  // namespace torus
