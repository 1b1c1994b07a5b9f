#include "node/lease_audit.h"

#include <cstdlib>
#include <utility>

#include "common/logging.h"
#include "common/rpc.h"

namespace torus {

namespace {
// How often the audit runs.
constexpr auto kPeriod = std::chrono::milliseconds(500);
}  // namespace

LeaseAudit::LeaseAudit(std::string token, Hooks hooks) : token_(std::move(token)), hooks_(std::move(hooks)) {
  if (const char* v = getenv("TORUS_LEASE_CHECK_MS"); v && *v) {
    char* end = nullptr;
    long ms = strtol(v, &end, 10);
    if (end && *end == '\0' && ms > 0) {
      check_age_ = std::chrono::milliseconds(ms);
    } else {
      TORUS_LOG(WARNING) << "TORUS_LEASE_CHECK_MS='" << v << "' is not a positive number of ms; using "
                         << check_age_.count();
    }
  }
}

void LeaseAudit::Start() {
  thread_.Start(kPeriod, [this]() -> std::optional<std::chrono::milliseconds> {
    Round();
    return kPeriod;
  });
}

void LeaseAudit::Round() {
  for (const auto& q : hooks_.due(check_age_)) {
    rpc::CheckLeaseRequest req;
    req.set_lease_id(q.lease_id);
    rpc::CheckLeaseReply reply;
    auto ctx = NewContext(token_, 1000);
    auto st = rpc::CoreWorker::NewStub(GetChannel(q.address))->CheckLease(ctx.get(), req, &reply);
    if (!st.ok()) continue;  // a dead worker is the reaper's; a busy one is asked again
    hooks_.answered(q, reply.use());
  }
}

}  // namespace torus
