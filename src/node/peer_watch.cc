#include "node/peer_watch.h"

#include <algorithm>
#include <chrono>

#include "common/logging.h"
#include "common/rpc.h"

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;
// Keepalive on the watch link: a vanished host is found after about 1 + 1 s.
constexpr int kKeepIdleS = 1, kKeepIntervalS = 1, kKeepCount = 1;
}  // namespace

PeerWatch::PeerWatch(std::string token, std::string my_id, Lost lost)
    : token_(std::move(token)), my_id_(std::move(my_id)), lost_(std::move(lost)) {
  thread_ = std::thread([this] { Run(); });
}

void PeerWatch::SetTarget(const rpc::WatchTarget& t) {
  MutexLock lock(mu_);
  if (stop_ || (t.node_id() == target_.node_id() && t.address() == target_.address())) return;
  target_ = t;
  ++version_;
  if (stream_) stream_->Cancel();
  cv_.NotifyAll();
}

std::string PeerWatch::watching() const {
  MutexLock lock(mu_);
  return target_.node_id();
}

void PeerWatch::Stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
    if (stream_) stream_->Cancel();
    cv_.NotifyAll();
  }
  if (thread_.joinable()) thread_.join();
}

void PeerWatch::Run() {
  int backoff_ms = 0;
  uint64_t reported = 0;  // the version whose loss was told (0: none)
  uint64_t version = 0;   // the target's version handled last
  for (;;) {
    rpc::WatchTarget t;
    {
      MutexLock lock(mu_);
      if (backoff_ms > 0) {  // cut short by a new target (also one set before the wait) or Stop
        const auto until = Clock::now() + std::chrono::milliseconds(backoff_ms);
        while (!stop_ && version_ == version && cv_.WaitUntil(lock, until)) {
        }
      }
      while (!stop_ && target_.node_id().empty()) cv_.Wait(lock);
      if (stop_) return;
      t = target_;
      version = version_;
    }
    if (InProcessServiceAt(t.address())) {  // same process (an embedded cluster): nothing to watch
      MutexLock lock(mu_);
      while (!stop_ && version_ == version) cv_.Wait(lock);
      continue;
    }
    bool linked = false;
    std::string how = Hold(t, version, &linked);
    if (how.empty()) {  // a new target, or Stop
      backoff_ms = 0;
      continue;
    }
    {
      MutexLock lock(mu_);
      if (stop_) return;
      if (version != version_) {  // a new target meanwhile: nothing to tell of the old one
        backoff_ms = 0;
        continue;
      }
    }
    if (linked) reported = 0;  // it was watched again: a new loss is told again
    if (reported != version) {
      TORUS_LOG(INFO) << "watch link to node " << t.node_id() << " at " << t.address() << " "
                      << (linked ? "ended" : "could not be opened") << " (" << how << "); telling the head";
      if (lost_(t.node_id(), how)) reported = version;  // else told again after the backoff
    }
    backoff_ms = linked ? 200 : std::clamp(backoff_ms * 2, 200, 1000);
  }
}

std::string PeerWatch::Hold(const rpc::WatchTarget& t, uint64_t version, bool* linked) {
  auto s = LaneClientStream::Open(t.address(), token_, kWatchMethod);
  if (!s) return "its lane at " + t.address() + " cannot be reached";
  s->KeepAlive(kKeepIdleS, kKeepIntervalS, kKeepCount);
  {
    MutexLock lock(mu_);
    if (stop_ || version != version_) return "";
    stream_ = s.get();
  }
  rpc::WatchHello hello;
  hello.set_node_id(t.node_id());
  hello.set_watcher_id(my_id_);
  rpc::WatchHello ack;  // the target answers the hello once it checked it is the node meant
  if (s->Write(hello) && s->Read(&ack)) {
    *linked = true;
    while (s->Read(&ack)) {
    }
  }
  grpc::Status st = s->Finish();
  {
    MutexLock lock(mu_);
    stream_ = nullptr;
    if (stop_ || version != version_) return "";
  }
  return st.ok() ? "closed by its node" : st.error_message();
}

}  // namespace torus
