#include "common/http_parse.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/text.h"

namespace torus {

namespace {

bool IsTokenChar(unsigned char c) {
  // RFC 9110 tchar
  return std::isalnum(c) || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

// Without the optional whitespace (spaces and tabs, RFC 9110) around a header value.
std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// True when the comma-separated header value holds `token` (case-insensitive).
bool HasToken(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    size_t comma = value.find(',');
    std::string_view part = TrimOws(value.substr(0, comma));
    if (Lower(part) == token) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

ParseResult Fail(int code, std::string reason, int* status, std::string* why) {
  *status = code;
  *why = std::move(reason);
  return ParseResult::kError;
}

// "GET /path?q HTTP/1.1" into *head.
ParseResult ParseRequestLine(std::string_view line, HttpHead* head, int* status, std::string* why) {
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == 0 || sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return Fail(400, "malformed request line", status, why);
  }
  std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (!std::all_of(method.begin(), method.end(), [](unsigned char c) { return IsTokenChar(c); })) {
    return Fail(400, "malformed request method", status, why);
  }
  if (version.size() != 8 || version.substr(0, 7) != "HTTP/1." || (version[7] != '0' && version[7] != '1')) {
    return Fail(505, "only HTTP/1.0 and HTTP/1.1 are served", status, why);
  }
  head->method = std::string(method);
  head->minor_version = version[7] - '0';
  // The absolute form ("http://host/path") is reduced to its path.
  if (target.substr(0, 7) == "http://" || target.substr(0, 8) == "https://") {
    size_t slash = target.find('/', target.find("//") + 2);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  if (target.empty() || target.front() != '/') return Fail(400, "the request target is not a path", status, why);
  size_t q = target.find('?');
  std::string decoded;
  if (!UrlDecode(target.substr(0, q), &decoded)) return Fail(400, "malformed percent-escape in the path", status, why);
  if (decoded.find('\0') != std::string::npos) return Fail(400, "a NUL byte in the path", status, why);
  head->path = RemoveDotSegments(decoded);
  head->query = q == std::string_view::npos ? "" : std::string(target.substr(q + 1));
  return ParseResult::kDone;
}

// The framing and connection headers once all are read.
ParseResult ApplyHeaders(HttpHead* head, int* status, std::string* why) {
  auto get = [&](const char* name) -> std::string {
    auto it = head->headers.find(name);
    return it == head->headers.end() ? "" : it->second;
  };
  std::string connection = get("connection");
  head->keep_alive = head->minor_version == 1 ? !HasToken(connection, "close") : HasToken(connection, "keep-alive");
  std::string te = get("transfer-encoding");
  std::string cl = get("content-length");
  if (!te.empty()) {
    if (Lower(TrimOws(te)) != "chunked") return Fail(501, "Transfer-Encoding other than chunked", status, why);
    if (!cl.empty()) return Fail(400, "both Transfer-Encoding and Content-Length", status, why);
    head->chunked = true;
  } else if (!cl.empty()) {
    // Repeated headers were joined with ", ": anything but digits is refused (no smuggling).
    if (cl.size() > 18 || !std::all_of(cl.begin(), cl.end(), [](unsigned char c) { return std::isdigit(c); })) {
      return Fail(400, "malformed Content-Length", status, why);
    }
    head->content_length = std::stoull(cl);
  }
  head->expect_continue = Lower(TrimOws(get("expect"))) == "100-continue";
  head->upgrade_websocket = HasToken(get("upgrade"), "websocket") && HasToken(connection, "upgrade");
  return ParseResult::kDone;
}

}  // namespace

ParseResult ParseHttpHead(std::string_view buf, const HttpLimits& limits, HttpHead* head, size_t* head_len,
                          int* status, std::string* why, size_t* scanned) {
  constexpr size_t kMaxRequestLine = 8192;
  size_t from = scanned ? std::min(*scanned, buf.size()) : 0;
  size_t limit = std::min(buf.size(), limits.max_head_bytes + 4);
  // Up to 4 blank lines before a request are ignored (RFC 9112 2.2); a fifth is a malformed
  // request line.
  size_t start = 0;
  while (start < 8 && start + 1 < buf.size() && buf[start] == '\r' && buf[start + 1] == '\n') start += 2;
  size_t end = buf.find("\r\n\r\n", std::max(start, from >= 3 ? from - 3 : 0));
  // Only the head's own bytes are checked (a body may follow in the same buffer).
  size_t check_to = end == std::string_view::npos ? limit : std::min(end, limit);
  for (size_t i = from; i < check_to; ++i) {
    auto c = static_cast<unsigned char>(buf[i]);
    if ((c < 0x20 && c != '\r' && c != '\n' && c != '\t') || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", c);
      return Fail(400, std::string("a control byte (") + hex + ") in the request head", status, why);
    }
  }
  if (end == std::string_view::npos) {
    if (scanned) *scanned = limit;
    if (buf.size() > limits.max_head_bytes) return Fail(431, "request head over the size limit", status, why);
    size_t eol = buf.find("\r\n", start);
    if (eol == std::string_view::npos) {
      if (buf.size() - start > kMaxRequestLine) return Fail(414, "request line over 8 KiB", status, why);
      return ParseResult::kNeedMore;
    }
    // The request line just became complete: refuse it now if it is malformed.
    HttpHead line;
    if (eol + 2 > from && ParseRequestLine(buf.substr(start, eol - start), &line, status, why) != ParseResult::kDone) {
      return ParseResult::kError;
    }
    return ParseResult::kNeedMore;
  }
  if (end + 4 > limits.max_head_bytes) return Fail(431, "request head over the size limit", status, why);
  std::string_view all = buf.substr(start, end - start);
  size_t eol = all.find("\r\n");
  if (auto r = ParseRequestLine(all.substr(0, eol), head, status, why); r != ParseResult::kDone) return r;
  size_t count = 0;
  while (eol != std::string_view::npos) {
    all.remove_prefix(eol + 2);
    eol = all.find("\r\n");
    std::string_view line = all.substr(0, eol);
    if (line.empty() || line.front() == ' ' || line.front() == '\t') return Fail(400, "malformed header line", status, why);
    if (++count > limits.max_headers) return Fail(431, "too many request headers", status, why);
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return Fail(400, "malformed header line", status, why);
    std::string_view name = line.substr(0, colon);
    if (!std::all_of(name.begin(), name.end(), [](unsigned char c) { return IsTokenChar(c); })) {
      return Fail(400, "malformed header name", status, why);
    }
    std::string_view value = TrimOws(line.substr(colon + 1));
    if (std::any_of(value.begin(), value.end(), [](unsigned char c) { return (c < 0x20 && c != '\t') || c == 0x7f; })) {
      return Fail(400, "a control character in a header value", status, why);
    }
    std::string& slot = head->headers[Lower(name)];
    if (!slot.empty()) slot += ", ";
    slot += value;
  }
  *head_len = end + 4;
  return ApplyHeaders(head, status, why);
}

ParseResult ChunkedDecoder::Feed(std::string& in, std::string* body, int* status, std::string* why) {
  size_t pos = 0;
  ParseResult result = ParseResult::kNeedMore;
  while (result == ParseResult::kNeedMore) {
    if (stage_ == Stage::kData) {
      size_t take = static_cast<size_t>(std::min<uint64_t>(left_, in.size() - pos));
      if (take == 0) break;
      body->append(in, pos, take);
      pos += take;
      left_ -= take;
      if (left_ == 0) stage_ = Stage::kDataEnd;
      continue;
    }
    size_t eol = in.find("\r\n", pos);
    if (eol == std::string::npos) {
      if (in.size() - pos > 4096) result = Fail(400, "malformed chunk framing", status, why);
      break;
    }
    std::string_view line(in.data() + pos, eol - pos);
    pos = eol + 2;
    if (stage_ == Stage::kDataEnd) {
      if (!line.empty()) result = Fail(400, "malformed chunk framing", status, why);
      stage_ = Stage::kSize;
    } else if (stage_ == Stage::kTrailers) {
      if (line.empty()) {
        stage_ = Stage::kDone;
        result = ParseResult::kDone;
      }
    } else {  // kSize: hex digits, then optional extensions after ';'
      line = TrimOws(line.substr(0, line.find(';')));
      uint64_t n = 0;
      if (line.empty() || line.size() > 15) {
        result = Fail(400, "malformed chunk size", status, why);
        break;
      }
      for (char c : line) {
        if (!std::isxdigit(static_cast<unsigned char>(c))) return Fail(400, "malformed chunk size", status, why);
        n = n * 16 + static_cast<uint64_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
      }
      if (body->size() + n > max_body_) {
        result = Fail(413, "request body over the limit of " + std::to_string(max_body_) + " bytes", status, why);
        break;
      }
      left_ = n;
      stage_ = n == 0 ? Stage::kTrailers : Stage::kData;
    }
  }
  in.erase(0, pos);
  return result;
}

bool UrlDecode(std::string_view in, std::string* out, bool plus_is_space) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size() || !std::isxdigit(static_cast<unsigned char>(in[i + 1])) ||
          !std::isxdigit(static_cast<unsigned char>(in[i + 2]))) {
        return false;
      }
      *out += static_cast<char>(std::stoi(std::string(in.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      *out += plus_is_space && c == '+' ? ' ' : c;
    }
  }
  return true;
}

std::string RemoveDotSegments(std::string_view path) {
  std::vector<std::string_view> out;
  size_t i = 0;
  bool trailing = false;
  while (i <= path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    std::string_view seg = path.substr(i, j - i);
    trailing = seg.empty() || seg == "." || seg == "..";
    if (seg == "..") {
      if (!out.empty()) out.pop_back();
    } else if (!seg.empty() && seg != ".") {
      out.push_back(seg);
    }
    i = j + 1;
  }
  std::string result;
  for (auto s : out) {
    result += '/';
    result += s;
  }
  if (result.empty() || (trailing && path.size() > 1)) result += '/';
  return result;
}

bool QueryValue(std::string_view query, std::string_view name, std::string* value) {
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    size_t eq = pair.find('=');
    std::string key;
    if (UrlDecode(pair.substr(0, eq), &key, true) && key == name) {
      return UrlDecode(eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1), value, true);
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return false;
}

const char* HttpStatusText(int status) {
  switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "";
  }
}

}  // namespace torus
