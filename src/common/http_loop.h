// The event loop under common/http_server.h (internal to it): one epoll thread that owns every
// connection — accepting, reading and parsing requests, enforcing the deadlines and the per-client
// and global limits, writing responses — with handlers run on a pool (and a probe thread) and
// websockets on threads of their own. The contract and the limits are HttpServer's (its header).
//
// THREADS
//  - the loop thread owns `conns_`, `clients_` and every Conn; nothing else touches them.
//  - pool/probe threads run handlers and hand the serialized response back through `done_`
//    (guarded by mu_) and a write to the eventfd `wake_fd_`.
//  - stream threads run HttpServer::Stream and close their fd; `streams_` (guarded by mu_)
//    holds them until they are joined (by the loop when they end, or by Stop).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/http_parse.h"
#include "common/http_server.h"
#include "common/thread_annotations.h"
#include "common/work_queue.h"

namespace torus {

// The bytes of `r` as a response (a body-less one for HEAD).
std::string SerializeResponse(const HttpResponse& r, bool head_only, bool keep_alive);

struct HttpServer::Loop {
  using Clock = std::chrono::steady_clock;

  explicit Loop(HttpServer& server);
  ~Loop();
  // Binds and listens on `port` (0: any); the port bound, or -1 with *error.
  int Listen(int port, std::string* error);
  void Start();
  // Closes the listener and every connection, finishes the running handlers, joins all threads.
  void Stop();

 private:
  // kLinger: the answer is out and our side shut; the peer's remaining bytes are read and dropped
  // until it closes (so that closing cannot reset the answer in flight), at most 2 s.
  enum class State { kIdle, kHead, kBody, kBusy, kWrite, kLinger };
  struct Conn {
    uint64_t id = 0;
    int fd = -1;
    std::string client;  // the peer's address
    State state = State::kIdle;
    Clock::time_point since;     // accepted, or last became idle: eviction takes the oldest first
    Clock::time_point deadline;  // of the current state (none while kBusy)
    uint32_t events = 0;         // epoll interest now
    std::string in;
    size_t scanned = 0;  // bytes of `in` ParseHttpHead has checked for the current head
    std::string out;
    size_t out_done = 0;
    HttpHead head;
    HttpRequest req;
    const Route* route = nullptr;  // of the request being read (routes are constant)
    std::unique_ptr<ChunkedDecoder> chunked;
    bool keep_alive = true;  // after the response being written
  };
  struct Client {
    int conns = 0;
    int requests = 0;  // queued or running
  };
  struct Done {
    uint64_t conn;
    std::string bytes;
    bool keep_alive;
    bool pool;  // ran on the pool (else the probe thread)
  };
  struct StreamThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> ended;
  };

  void Run();
  void Accept();
  void Admit(int fd, const std::string& client);
  // Closes the oldest connection of `client` ("" for any) not running a request; false if none.
  bool EvictOldest(const std::string& client);
  void OnEvent(uint64_t id, uint32_t events);
  void Read(Conn& c);
  // Parses what `c` has buffered and acts on it. `c` may be closed or handed away on return.
  void Advance(Conn& c);
  // These return true when `c` is still reading (else it may be gone).
  bool OnHead(Conn& c);
  bool ReadBody(Conn& c);
  void Dispatch(Conn& c, const Route& r);
  void StartStream(Conn& c, const Route& r);
  // Queues `bytes` on `c` and starts writing; `keep_alive` false closes after it.
  void Respond(Conn& c, std::string bytes, bool keep_alive);
  void Refuse(Conn& c, int status, const std::string& why);
  void Flush(Conn& c);
  void ResponseWritten(Conn& c);
  void SetInterest(Conn& c, uint32_t events);
  void SetState(Conn& c, State s, Clock::time_point now);
  void Close(uint64_t id);
  void TakeDone();
  void Sweep(Clock::time_point now);
  void ReapStreams(bool all) EXCLUDES(mu_);
  void Wake();

  // Constant after Start().
  HttpServer& server_;
  const Options& opts_;
  HttpLimits limits_;
  int max_conns_ = 0;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int spare_fd_ = -1;  // given up to accept-and-close when the process is out of files
  std::thread thread_;

  // Owned by the loop thread.
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<std::string, Client> clients_;
  uint64_t next_id_ = 2;  // 0: the listener, 1: the eventfd
  int queued_ = 0;        // pool requests queued or running
  Clock::time_point last_sweep_;

  WorkQueue pool_;
  WorkQueue probe_;
  Mutex mu_;
  std::vector<Done> done_ GUARDED_BY(mu_);
  std::vector<StreamThread> streams_ GUARDED_BY(mu_);
};

}  // namespace torus
