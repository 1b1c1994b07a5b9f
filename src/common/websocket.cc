#include "common/websocket.h"

#include <openssl/evp.h>

#include <cstdint>

namespace torus {

namespace {

std::string Base64(const unsigned char* data, size_t n) {
  static const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = static_cast<uint32_t>(data[i]) << 16;
    if (i + 1 < n) v |= static_cast<uint32_t>(data[i + 1]) << 8;
    if (i + 2 < n) v |= data[i + 2];
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < n ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < n ? kAlphabet[v & 63] : '=';
  }
  return out;
}

}  // namespace

std::string WebSocketAccept(std::string_view key) {
  std::string text = std::string(key) + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(text.data(), text.size(), md, &len, EVP_sha1(), nullptr) != 1) return "";
  return Base64(md, len);
}

std::string WebSocketFrame(int opcode, std::string_view payload) {
  std::string f;
  f += static_cast<char>(0x80 | (opcode & 0x0f));
  uint64_t n = payload.size();
  if (n < 126) {
    f += static_cast<char>(n);
  } else if (n <= 0xffff) {
    f += static_cast<char>(126);
    f += static_cast<char>(n >> 8);
    f += static_cast<char>(n & 0xff);
  } else {
    f += static_cast<char>(127);
    for (int shift = 56; shift >= 0; shift -= 8) f += static_cast<char>((n >> shift) & 0xff);
  }
  f.append(payload);
  return f;
}

ParseResult TakeWebSocketFrame(std::string& buf, size_t max_payload, WsFrame* frame, std::string* why) {
  if (buf.size() < 2) return ParseResult::kNeedMore;
  auto byte = [&](size_t i) { return static_cast<unsigned char>(buf[i]); };
  if ((byte(1) & 0x80) == 0) {
    *why = "an unmasked frame from the client";
    return ParseResult::kError;
  }
  uint64_t n = byte(1) & 0x7f;
  size_t at = 2;
  if (n == 126 || n == 127) {
    size_t width = n == 126 ? 2 : 8;
    if (buf.size() < at + width) return ParseResult::kNeedMore;
    n = 0;
    for (size_t i = 0; i < width; ++i) n = (n << 8) | byte(at + i);
    at += width;
  }
  if (n > max_payload) {
    *why = "a frame of " + std::to_string(n) + " bytes (the limit is " + std::to_string(max_payload) + ")";
    return ParseResult::kError;
  }
  if (buf.size() < at + 4 + n) return ParseResult::kNeedMore;
  const unsigned char* mask = reinterpret_cast<const unsigned char*>(buf.data() + at);
  at += 4;
  frame->opcode = byte(0) & 0x0f;
  frame->payload.resize(static_cast<size_t>(n));
  for (size_t i = 0; i < n; ++i) frame->payload[i] = static_cast<char>(byte(at + i) ^ mask[i % 4]);
  buf.erase(0, at + static_cast<size_t>(n));
  return ParseResult::kDone;
}

}  // namespace torus
