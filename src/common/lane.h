// The lane: a lean unary RPC transport for the hot control-plane calls (placement groups and
// slice reservations: driver -> head, head -> nodes), next to gRPC.
//
// Why: on this class of machine a gRPC unary round trip over loopback costs ~170 us and most of a
// CPU-millisecond across both processes (HTTP/2 framing, completion queues, thread hand-offs),
// while a plain TCP round trip costs ~26 us. A slice reservation is two such levels (client ->
// head -> every host), so gRPC alone made reserve+release of a 4-host slice take ~2.4 ms.
//
// What: the same protobuf messages and the same service handlers as gRPC, framed over persistent
// TCP connections with blocking I/O (one server thread per authenticated connection; the calling
// thread does its own read). The cluster token is checked once per connection (the first frame,
// the hello). Before its hello a connection costs no thread: one acceptor thread reads the hellos
// of all pending connections (non-blocking), closes those without one within
// kLaneHelloTimeoutMs, keeps at most kLaneMaxPending of them (the oldest is dropped), and hands
// only authenticated ones to their own thread (at most kLaneMaxConnections). A server
// advertises its lane port through the gRPC service `Lane.Where`; a client that cannot reach a
// lane uses gRPC, so the lane is an optimisation, never a requirement. Wire format: docs/wire.md.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/rpc.h"
#include "common/thread_annotations.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

// Frame header, little-endian, 16 bytes, followed by `text_len` bytes of text (method name in a
// call, token in a hello, error message in a reply) and `payload_len` bytes of protobuf.
struct LaneHeader {
  uint32_t magic;        // kLaneMagic
  uint8_t kind;          // LaneKind
  uint8_t reserved;      // 0
  uint16_t code;         // replies: grpc::StatusCode; otherwise 0
  uint32_t text_len;     // <= kLaneMaxText
  uint32_t payload_len;  // <= kLaneMaxPayload
};
static_assert(sizeof(LaneHeader) == 16);
inline constexpr uint32_t kLaneMagic = 0x314e4c54;  // "TLN1"
inline constexpr uint32_t kLaneMaxText = 64 << 10;
inline constexpr uint32_t kLaneMaxPayload = 64 << 20;
inline constexpr int kLaneHelloTimeoutMs = 2000;   // a connection's hello must come within this
inline constexpr size_t kLaneMaxPending = 256;     // connections accepted, hello not yet read
inline constexpr size_t kLaneMaxConnections = 1024;  // authenticated connections (one thread each)
// A connection carries calls (call -> reply, one at a time) or, after an `open`, one stream:
// `msg` frames both ways, the client's `end` (half-close), then the server's reply (the status).
enum LaneKind : uint8_t {
  kLaneHello = 1,
  kLaneCall = 2,
  kLaneReply = 3,
  kLaneOpen = 4,
  kLaneMsg = 5,
  kLaneEnd = 6
};

class LaneInbox;  // received bytes and the frames in them (lane.cc)

// The protobuf wire format, written by hand where building a message only to serialise it
// costs more than the call (bundle requests and replies). Field numbers come from the
// generated k*FieldNumber constants, never literals.
namespace wire {
// A map<K, V> field is a repeated message of {K key = 1; V value = 2;} (protobuf's map
// encoding; the generated entry classes keep their constants protected).
inline constexpr int kMapKeyField = 1;
inline constexpr int kMapValueField = 2;
inline void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
inline void PutTag(std::string* out, int field, int wire_type) {
  PutVarint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}
inline void PutBytes(std::string* out, int field, std::string_view v) {  // string, bytes, message
  PutTag(out, field, 2);
  PutVarint(out, v.size());
  out->append(v);
}
inline void PutDouble(std::string* out, int field, double v) {
  PutTag(out, field, 1);
  char b[8];
  memcpy(b, &v, 8);  // little-endian hosts only, as the lane's header
  out->append(b, 8);
}
}  // namespace wire

// The server's end of a lane stream: what a stream handler reads and writes.
class LaneServerStream {
 public:
  LaneServerStream(int fd, LaneInbox* in) : fd_(fd), in_(in) {}
  // The next message; false once the client half-closed or the connection is gone.
  bool Read(google::protobuf::MessageLite* m);
  // Thread-safe.
  bool Write(const google::protobuf::MessageLite& m);

 private:
  int fd_;
  LaneInbox* in_;
  std::mutex write_mu_;
  std::string buf_;
  bool done_ = false;
};

// The client's end: a dedicated connection. One reader thread; writers are serialised.
class LaneClientStream {
 public:
  // Opens `method` on the lane of the gRPC server at `address`; null when that peer has no lane
  // or does not serve the stream there (the caller then uses gRPC).
  static std::unique_ptr<LaneClientStream> Open(const std::string& address, const std::string& token,
                                                const std::string& method);
  ~LaneClientStream();
  bool Write(const google::protobuf::MessageLite& m);
  bool Read(google::protobuf::MessageLite* m);  // false at the end: then Finish()
  // Read with a limit: 1 once *m holds the next message; 0 when none came within timeout_ms
  // (a part of one that came is kept for the next read; < 0: no limit); -1 at the end.
  int ReadWithin(google::protobuf::MessageLite* m, int timeout_ms);
  void WritesDone();
  grpc::Status Finish();  // the server's status, or why the connection ended
  void Cancel();          // any thread: Read returns false, Finish says CANCELLED
  // TCP keepalive on the connection (a no-op on a same-host Unix socket): the first probe after
  // idle_s of silence, then `count` probes interval_s apart; none answered ends the stream.
  void KeepAlive(int idle_s, int interval_s, int count);

  LaneClientStream(int fd, std::string what);

 private:
  int fd_;
  std::string what_;  // "method on address", for errors
  std::unique_ptr<LaneInbox> in_;
  std::mutex write_mu_;
  std::string buf_;
  std::atomic<bool> cancelled_{false};
  grpc::Status final_;
  bool have_final_ = false;
};

// Serves registered handlers on its own port, and tells gRPC clients that port (`Lane.Where`:
// register the LaneServer with the process's gRPC server).
// THREADS: one acceptor thread (accepts, reads hellos, joins finished connection threads) and one
// thread per authenticated connection; Stop() from any thread but those.
class LaneServer final : public rpc::Lane::Service {
 public:
  LaneServer(std::string token, std::string what);  // `what` names the process in logs
  ~LaneServer() override;

  // Serves `method` (gRPC's full name, e.g. "/torus.rpc.Node/PrepareBundles") with `fn` of
  // `svc`, exactly as a direct in-process call (the token was checked at the connection's hello).
  template <class Impl, class Service, class Req, class Rep>
  void Handle(const std::string& method, Impl* impl,
              grpc::Status (Service::*fn)(grpc::ServerContext*, const Req*, Rep*)) {
    Service* svc = impl;
    Handler h = [svc, fn, method](std::string_view in, std::string* out) {
      // The request, reply and context are kept per thread and reused (Clear keeps what they
      // allocated): at 64 hosts a reservation is 128 such calls, and building and freeing the
      // messages each time was a large part of their cost. A nested call on the same thread
      // (not made today) would get fresh ones.
      struct Reused {
        Req req;
        Rep rep;
        grpc::ServerContext ctx;
        bool busy = false;
      };
      thread_local Reused mine;
      std::unique_ptr<Reused> fresh;
      Reused* r = &mine;
      if (r->busy) {
        fresh = std::make_unique<Reused>();
        r = fresh.get();
      }
      r->busy = true;
      struct Done {
        Reused* r;
        bool big;
        std::string* out;
        ~Done() {
          // A large request or reply (a whole cluster view, say) is not kept for the next call:
          // its memory goes back instead of staying with this connection's thread.
          if (big || out->size() > (64u << 10)) {
            r->req = Req();
            r->rep = Rep();
          } else {
            r->req.Clear();
            r->rep.Clear();
          }
          r->busy = false;
        }
      } done{r, in.size() > (64u << 10), out};
      if (!r->req.ParseFromArray(in.data(), static_cast<int>(in.size()))) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "the " + method + " request is not a valid message");
      }
      DirectCallScope scope;
      grpc::Status st = (svc->*fn)(&r->ctx, &r->req, &r->rep);
      if (st.ok()) r->rep.SerializeToString(out);
      return st;
    };
    for (auto& [m, f] : handlers_) {
      if (m == method) {
        f = std::move(h);
        return;
      }
    }
    handlers_.emplace_back(method, std::move(h));
  }

  // Serves `method` with `fn` on the serialised request, which writes the serialised reply
  // into *out (empty on entry) when it returns OK: for handlers that parse or write the
  // protobuf wire format themselves on a hot path. The token was checked at the hello.
  void HandleRaw(const std::string& method, std::function<grpc::Status(std::string_view, std::string*)> fn) {
    for (auto& [m, f] : handlers_) {
      if (m == method) {
        f = std::move(fn);
        return;
      }
    }
    handlers_.emplace_back(method, std::move(fn));
  }

  // Serves a stream `method` with `fn`, on its own connection, until fn returns; its status is
  // the stream's end.
  void HandleStream(const std::string& method, std::function<grpc::Status(LaneServerStream*)> fn) {
    streams_[method] = std::move(fn);
  }

  // Listens on bind_host (port 0 = any); call after every Handle. Returns the port or 0.
  int Start(const std::string& bind_host);
  // Closes the port and every connection, and waits up to `max_wait` for handlers in progress.
  // False if some still run: the server must then outlive them (the caller leaks it).
  bool Stop(std::chrono::milliseconds max_wait = std::chrono::milliseconds::max()) EXCLUDES(mu_);
  int port() const { return port_; }
  const std::string& unix_name() const { return unix_name_; }
  // The port of the gRPC server this lane belongs to. Once set, a hello that names another gRPC
  // port is refused with FAILED_PRECONDITION: a client whose remembered lane port now belongs to
  // another process (its server died, the port was taken again) learns it at once.
  void SetGrpcPort(int port) { grpc_port_ = port; }

  grpc::Status Where(grpc::ServerContext* ctx, const rpc::Empty* req, rpc::LaneWhereReply* reply) override;

 private:
  using Handler = std::function<grpc::Status(std::string_view, std::string*)>;
  struct PendingHello;  // an accepted connection whose hello has not come yet (lane.cc)
  void AcceptLoop();
  void AcceptNew(int listen_fd, bool tcp, std::deque<PendingHello>* pending);
  // Reads what has come of p's hello; false once p is settled (admitted or closed).
  bool ReadHello(PendingHello& p);
  // An authenticated connection: answers the hello and starts its thread, or says "full".
  void Admit(int fd, std::string early) EXCLUDES(mu_);
  void JoinFinished() EXCLUDES(mu_);
  void LogRefusals(bool force);
  // Serves calls on an authenticated connection; `early` holds bytes read after the hello.
  void Serve(int fd, std::string early, uint64_t id) EXCLUDES(mu_);

  const std::string token_;
  const std::string what_;
  // Fixed before Start; a few methods each, looked up by a linear scan of string_views (no
  // string built per call).
  std::vector<std::pair<std::string, Handler>> handlers_;
  std::unordered_map<std::string, std::function<grpc::Status(LaneServerStream*)>> streams_;
  int listen_fd_ = -1;       // TCP
  int unix_fd_ = -1;         // abstract Unix socket, same host only
  int wake_fd_ = -1;         // eventfd: wakes the accept loop at Stop
  int port_ = 0;
  std::atomic<int> grpc_port_{0};  // 0: not told (any hello's port is accepted)
  std::string unix_name_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  Mutex mu_;
  CondVar cv_;                                   // threads_ fell
  std::unordered_set<int> conns_ GUARDED_BY(mu_);  // open authenticated connection fds
  int threads_ GUARDED_BY(mu_) = 0;              // connection threads still running
  bool full_logged_ GUARDED_BY(mu_) = false;
  uint64_t next_conn_id_ GUARDED_BY(mu_) = 0;
  // Connection threads, joined when finished.
  std::unordered_map<uint64_t, std::thread> serving_ GUARDED_BY(mu_);
  std::vector<uint64_t> finished_ GUARDED_BY(mu_);  // ids of threads that have ended
  // Acceptor only: refusals since the last log line (logged at most every 10 s).
  size_t hello_late_ = 0, hello_dropped_ = 0, hello_garbled_ = 0;
  std::chrono::steady_clock::time_point refusals_logged_{};
};

// One call's outcome. `delivered` is false when the request never reached a lane server (no lane,
// connect refused, hello refused for a reason other than the token): the caller may use gRPC.
struct LaneResult {
  grpc::Status status;
  std::string reply;
  bool delivered = false;
};

struct LaneRequest {
  std::string address;  // the peer's gRPC address (host:port)
  std::string method;   // gRPC's full method name
  std::string payload;  // serialised request
};

// Calls every request at once (all sent before any reply is read) and returns the outcomes in
// order. `deadline_ms` bounds the whole batch.
std::vector<LaneResult> LaneCallMany(const std::string& token, const std::vector<LaneRequest>& reqs,
                                     int64_t deadline_ms);

// Records that the gRPC server at `address` has its lane on `port` (from a registration), so
// the first call needs no Lane.Where round trip.
void NoteLane(const std::string& address, int port, const std::string& unix_name);

// True if a lane is known (or, after one `Lane.Where` call, found) at this gRPC address.
bool HasLane(const std::string& address, const std::string& token);

// A unary call with the lane when the peer has one, else gRPC (or a direct call in-process,
// as Unary in rpc.h).
template <class Service, class Stub, class Req, class Rep>
grpc::Status LaneUnary(const std::string& address, const std::string& token, int64_t deadline_ms,
                       const char* method,
                       grpc::Status (Service::*local)(grpc::ServerContext*, const Req*, Rep*),
                       grpc::Status (Stub::*remote)(grpc::ClientContext*, const Req&, Rep*),
                       const Req& req, Rep* rep) {
  if (!InProcessServiceAt(address) && HasLane(address, token)) {
    std::vector<LaneRequest> one(1);
    one[0] = {address, method, req.SerializeAsString()};
    auto r = LaneCallMany(token, one, deadline_ms);
    if (r[0].delivered) {
      if (r[0].status.ok() && !rep->ParseFromString(r[0].reply)) {
        return grpc::Status(grpc::StatusCode::INTERNAL,
                            std::string("the lane reply to ") + method + " is not a valid message");
      }
      return r[0].status;
    }
  }
  return Unary(address, token, deadline_ms, local, remote, req, rep);
}

}  // namespace torus
