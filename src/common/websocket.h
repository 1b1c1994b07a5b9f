// The WebSocket (RFC 6455) pieces common/http_server.h needs for its server-to-client streams:
// the handshake's accept key, server frames, and reading the frames a client sends (masked; only
// control frames matter to a stream: close and ping). Pure functions over bytes; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/http_parse.h"

namespace torus {

inline constexpr int kWsText = 0x1;
inline constexpr int kWsClose = 0x8;
inline constexpr int kWsPing = 0x9;
inline constexpr int kWsPong = 0xA;

// Sec-WebSocket-Accept for a client's Sec-WebSocket-Key: base64(SHA-1(key + RFC 6455's GUID)).
std::string WebSocketAccept(std::string_view key);

// One unmasked, final server frame.
std::string WebSocketFrame(int opcode, std::string_view payload);

struct WsFrame {
  int opcode = 0;
  std::string payload;  // unmasked
};

// The first whole client frame at the start of `buf`, erased from it: kDone with *frame, kNeedMore,
// or kError (*why) for an unmasked frame or one over `max_payload` bytes.
ParseResult TakeWebSocketFrame(std::string& buf, size_t max_payload, WsFrame* frame, std::string* why);

}  // namespace torus
