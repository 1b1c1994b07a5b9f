// HTTP/1.1 request decoding for common/http_server.h, as pure functions over bytes (no sockets,
// no threads): the request line and headers, the body's framing (Content-Length or chunked),
// percent-decoding, dot-segment removal and query lookup. Every limit is explicit and every
// malformed input ends in an error status with a reason; nothing here recurses or allocates more
// than the limits allow. Thread-safe (no shared state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace torus {

struct HttpLimits {
  size_t max_head_bytes = 64 * 1024;  // request line + headers (431 past it)
  size_t max_headers = 100;           // 431 past it
  size_t max_body_bytes = 16u << 20;  // 413 past it
};

// One decoded request head.
struct HttpHead {
  std::string method;
  std::string path;   // percent-decoded, dot segments removed, always starting with '/'
  std::string query;  // raw, without '?'
  int minor_version = 1;                       // HTTP/1.<minor>
  std::map<std::string, std::string> headers;  // names lower-cased; repeats joined with ", "
  bool keep_alive = true;                      // from the version and Connection
  bool chunked = false;                        // Transfer-Encoding: chunked
  uint64_t content_length = 0;                 // when !chunked
  bool expect_continue = false;                // Expect: 100-continue
  bool upgrade_websocket = false;              // Upgrade: websocket with Connection: upgrade
};

enum class ParseResult { kNeedMore, kDone, kError };

// Parses the head at the start of `buf`. kDone: *head filled and *head_len the bytes it took
// (through the blank line). kError: *status (400, 414, 431, 501, 505) and *why. kNeedMore: no
// blank line yet within the limit (kError 431 once `buf` is past max_head_bytes without one).
// Garbage is refused as soon as it shows: a control byte anywhere in the head, a request line
// that is malformed once complete or longer than 8 KiB. `scanned` (optional, 0 at the start of a
// request) keeps how far earlier calls on the same growing `buf` have checked, so that a head
// trickled byte by byte costs linear time, not quadratic.
ParseResult ParseHttpHead(std::string_view buf, const HttpLimits& limits, HttpHead* head, size_t* head_len,
                          int* status, std::string* why, size_t* scanned = nullptr);

// The body of a chunked request, decoded as its bytes arrive (state kept between calls).
class ChunkedDecoder {
 public:
  explicit ChunkedDecoder(size_t max_body) : max_body_(max_body) {}
  // Consumes what it can of `in` (erasing it) and appends data to *body. kDone after the last
  // chunk and its trailers; kError with *status (400, 413) and *why.
  ParseResult Feed(std::string& in, std::string* body, int* status, std::string* why);

 private:
  enum class Stage { kSize, kData, kDataEnd, kTrailers, kDone };
  Stage stage_ = Stage::kSize;
  uint64_t left_ = 0;  // bytes of the current chunk still to come
  size_t max_body_;
};

// "%41b+c" -> "Ab+c" ('+' stays; in a query value it is a space: UrlDecode(s, true)). False when
// an escape is malformed.
bool UrlDecode(std::string_view in, std::string* out, bool plus_is_space = false);

// RFC 3986 5.2.4 on a decoded absolute path: "/a/./b/../c" -> "/a/c"; never above "/".
std::string RemoveDotSegments(std::string_view path);

// The decoded value of `name` in a raw query string ("a=1&b=x%20y"); false when absent.
bool QueryValue(std::string_view query, std::string_view name, std::string* value);

// "OK", "Not Found", ... ("" for codes it does not know).
const char* HttpStatusText(int status);

}  // namespace torus
