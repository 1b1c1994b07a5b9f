// Framing shared by both ends of the lane (lane.h): the bytes received on a connection and the
// frames in them (LaneInbox), and writing and reading whole frames on a blocking socket.
// Internal to src/common/lane*.cc; the wire format is docs/wire.md.
//
// Threading: a LaneInbox belongs to one connection and is used by one thread at a time (the
// connection's reader). The functions are thread-safe; concurrent writers of one socket
// serialise themselves (SendMessage takes the caller's mutex).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/lane.h"

namespace torus {

// Bytes received on one connection and the frames in them: one read() takes whatever has
// arrived (usually a whole frame), instead of one read per header, text and payload.
class LaneInbox {
 public:
  // 1: a whole frame of one of the `kinds` (bit 1 << kind) starts at the read position (h,
  // text, payload point into the buffer until the next Fill or Next; the position moves past
  // it); 0: more bytes needed; -1: the bytes are not a valid frame (*why says how).
  int Next(uint32_t kinds, LaneHeader* h, std::string_view* text, std::string_view* payload, std::string* why);
  void Reset() { pos_ = len_ = 0; }
  // Adds bytes received elsewhere (read with the hello) after the unread ones.
  void Append(std::string_view bytes);
  // One read of what is there: blocks while there is nothing if `wait`, else fails with EAGAIN.
  // Bytes read, 0 at end of stream, -1 on error (errno).
  ssize_t Fill(int fd, bool wait = true);

 private:
  static constexpr size_t kChunk = 4 << 10;
  // Moves the unread bytes to the front and makes room for `n` bytes from there on.
  void Make(size_t n);

  std::unique_ptr<char[]> data_;
  size_t cap_ = 0, len_ = 0, pos_ = 0;
};

namespace lane_internal {

using Clock = std::chrono::steady_clock;

// Splits "host:port" / "[v6]:port".
bool SplitHostPort(const std::string& address, std::string* host, std::string* port);

// Milliseconds until `deadline`, at least 0.
int64_t MsLeft(Clock::time_point deadline);

// Writes all of header + text + payload. False on any error (the connection is unusable).
bool SendFrame(int fd, LaneKind kind, uint16_t code, std::string_view text, std::string_view payload);

// Reads exactly n bytes. With a deadline, waits in poll() first. 1 = done, 0 = the peer closed
// before the first byte, -1 = error or closed midway, -2 = deadline passed.
int ReadFull(int fd, void* buf, size_t n, const Clock::time_point* deadline);

// "host:port" of the peer of a connected socket, or "?".
std::string PeerName(int fd);

// One protobuf message as a `msg` frame (both ends of a stream); `mu` serialises writers.
bool SendMessage(int fd, std::mutex& mu, std::string& buf, const google::protobuf::MessageLite& m);

}  // namespace lane_internal
}  // namespace torus
