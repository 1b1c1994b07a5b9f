#include "common/http_parse.h"

#include <gtest/gtest.h>

#include <string>

#include "common/websocket.h"

namespace torus {
namespace {

struct Parsed {
  ParseResult result;
  HttpHead head;
  size_t len = 0;
  int status = 0;
  std::string why;
};

Parsed Parse(const std::string& text, HttpLimits limits = {}) {
  Parsed p;
  p.result = ParseHttpHead(text, limits, &p.head, &p.len, &p.status, &p.why);
  return p;
}

TEST(HttpParseTest, RequestLineHeadersAndFraming) {
  auto p = Parse("POST /api/jobs/?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\nX-A: 1\r\nx-a: 2\r\n\r\nbody");
  ASSERT_EQ(p.result, ParseResult::kDone) << p.why;
  EXPECT_EQ(p.head.method, "POST");
  EXPECT_EQ(p.head.path, "/api/jobs/");
  EXPECT_EQ(p.head.query, "x=1");
  EXPECT_EQ(p.head.content_length, 12u);
  EXPECT_EQ(p.head.headers["x-a"], "1, 2");
  EXPECT_TRUE(p.head.keep_alive);
  EXPECT_EQ(std::string("POST /api/jobs/?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\nX-A: 1\r\nx-a: 2\r\n\r\n").size(), p.len);
  EXPECT_FALSE(Parse("GET / HTTP/1.0\r\n\r\n").head.keep_alive);
  EXPECT_TRUE(Parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").head.keep_alive);
  EXPECT_FALSE(Parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").head.keep_alive);
  EXPECT_TRUE(Parse("GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n").head.expect_continue);
  auto ws = Parse("GET /t HTTP/1.1\r\nUpgrade: WebSocket\r\nConnection: keep-alive, Upgrade\r\n\r\n");
  EXPECT_TRUE(ws.head.upgrade_websocket);
}

TEST(HttpParseTest, IncompleteHeadNeedsMoreUntilTheLimit) {
  EXPECT_EQ(Parse("GET / HTTP/1.1\r\nHost: x\r\n").result, ParseResult::kNeedMore);
  HttpLimits small;
  small.max_head_bytes = 64;
  auto p = Parse("GET / HTTP/1.1\r\nX: " + std::string(100, 'a'), small);
  EXPECT_EQ(p.result, ParseResult::kError);
  EXPECT_EQ(p.status, 431);
  small.max_head_bytes = 1 << 20;
  small.max_headers = 3;
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 5; ++i) many += "H" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(Parse(many + "\r\n", small).status, 431);
}

TEST(HttpParseTest, MalformedRequestsAreRefusedWithAReason) {
  struct Case {
    const char* text;
    int status;
  } cases[] = {
      {"GARBAGE\r\n\r\n", 400},
      {"GET /\r\n\r\n", 400},
      {"GET / HTTP/2.0\r\n\r\n", 505},
      {"G(T / HTTP/1.1\r\n\r\n", 400},
      {"GET nopath HTTP/1.1\r\n\r\n", 400},
      {"GET /%zz HTTP/1.1\r\n\r\n", 400},
      {"GET /a%00b HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: a\x01b\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400},  // smuggling
      {"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
  };
  for (const auto& c : cases) {
    auto p = Parse(c.text);
    EXPECT_EQ(p.result, ParseResult::kError) << c.text;
    EXPECT_EQ(p.status, c.status) << c.text;
    EXPECT_FALSE(p.why.empty()) << c.text;
  }
}

TEST(HttpParseTest, GarbageIsRefusedBeforeTheHeadEnds) {
  // Random bytes on the port: a control byte, a malformed complete request line, a request line
  // that never ends: each refused at once, not at the header deadline.
  auto p = Parse(std::string("\x16\x03\x01\x02\x00\x01", 6));  // a TLS hello
  EXPECT_EQ(p.result, ParseResult::kError);
  EXPECT_EQ(p.status, 400);
  EXPECT_NE(p.why.find("0x16"), std::string::npos) << p.why;
  EXPECT_EQ(Parse("GARBAGE LINE\r\nX: y").status, 400);
  EXPECT_EQ(Parse("GET /" + std::string(9000, 'a')).status, 414);
  EXPECT_EQ(Parse("GET / HTTP/1.1\r\nX: y").result, ParseResult::kNeedMore);
  EXPECT_EQ(Parse("\r\n\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\n\r\n").status, 400);  // blank lines are bounded
  // A binary body after the head in the same buffer is not part of the head.
  static const char kWithBody[] = "POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n\x00\x01";
  auto body = Parse(std::string(kWithBody, sizeof kWithBody - 1));
  EXPECT_EQ(body.result, ParseResult::kDone) << body.why;
}

TEST(HttpParseTest, ATrickledHeadIsScannedOnceAndParsesTheSame) {
  std::string text = "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc";
  std::string buf;
  size_t scanned = 0;
  HttpHead head;
  size_t len = 0;
  int status = 0;
  std::string why;
  ParseResult r = ParseResult::kNeedMore;
  for (char c : text) {
    buf += c;
    head = HttpHead{};
    r = ParseHttpHead(buf, HttpLimits{}, &head, &len, &status, &why, &scanned);
    ASSERT_NE(r, ParseResult::kError) << why;
    if (r == ParseResult::kDone) break;
    EXPECT_LE(scanned, buf.size());
  }
  ASSERT_EQ(r, ParseResult::kDone);
  EXPECT_EQ(head.path, "/a");
  EXPECT_EQ(head.content_length, 3u);
  EXPECT_EQ(len, text.size() - 3);
}

TEST(HttpParseTest, PathsAreDecodedAndCannotClimbAboveTheRoot) {
  EXPECT_EQ(Parse("GET /a%20b/./c/../d HTTP/1.1\r\n\r\n").head.path, "/a b/d");
  EXPECT_EQ(Parse("GET /../../etc/passwd HTTP/1.1\r\n\r\n").head.path, "/etc/passwd");
  EXPECT_EQ(Parse("GET /logs/%2e%2e/%2e%2e/x HTTP/1.1\r\n\r\n").head.path, "/x");
  EXPECT_EQ(Parse("GET http://host:8265/api/x?y HTTP/1.1\r\n\r\n").head.path, "/api/x");
  EXPECT_EQ(RemoveDotSegments("/"), "/");
  EXPECT_EQ(RemoveDotSegments("/a/b/"), "/a/b/");
  EXPECT_EQ(RemoveDotSegments("/a/.."), "/");
}

TEST(HttpParseTest, QueryValuesAreDecoded) {
  std::string v;
  ASSERT_TRUE(QueryValue("a=1&name=x%20y+z&b", "name", &v));
  EXPECT_EQ(v, "x y z");
  ASSERT_TRUE(QueryValue("a=1&b", "b", &v));
  EXPECT_EQ(v, "");
  EXPECT_FALSE(QueryValue("a=1", "c", &v));
}

TEST(HttpParseTest, ChunkedBodiesDecodeAcrossArbitrarySplits) {
  std::string wire = "4\r\nWiki\r\n5;ext=1\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nTrailer: x\r\n\r\nNEXT";
  for (size_t step = 1; step <= wire.size(); ++step) {
    ChunkedDecoder d(1000);
    std::string in, body, why;
    int status = 0;
    ParseResult r = ParseResult::kNeedMore;
    for (size_t i = 0; i < wire.size() && r == ParseResult::kNeedMore; i += step) {
      in += wire.substr(i, step);
      r = d.Feed(in, &body, &status, &why);
    }
    ASSERT_EQ(r, ParseResult::kDone) << "step " << step << ": " << why;
    EXPECT_EQ(body, "Wikipedia in\r\n\r\nchunks.");
    EXPECT_EQ(std::string("NEXT").rfind(in, 0), 0u) << in;  // what follows the body stays unread
  }
  ChunkedDecoder small(5);
  std::string in = "10\r\n0123456789abcdef\r\n0\r\n\r\n", body, why;
  int status = 0;
  EXPECT_EQ(small.Feed(in, &body, &status, &why), ParseResult::kError);
  EXPECT_EQ(status, 413);
  ChunkedDecoder bad(1000);
  in = "zz\r\n";
  EXPECT_EQ(bad.Feed(in, &body, &status, &why), ParseResult::kError);
  EXPECT_EQ(status, 400);
}

TEST(WebSocketTest, AcceptKeyAndFrames) {
  EXPECT_EQ(WebSocketAccept("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");  // RFC 6455 1.3
  EXPECT_EQ(WebSocketFrame(kWsText, "hi"), std::string("\x81\x02hi"));
  std::string big(70000, 'x');
  auto f = WebSocketFrame(kWsText, big);
  EXPECT_EQ(static_cast<unsigned char>(f[1]), 127);
  EXPECT_EQ(f.size(), big.size() + 10);
  // A masked client close frame, then half of another frame.
  std::string in = std::string("\x88\x82", 2) + std::string("\x01\x02\x03\x04", 4) + "\x02\xea" + "\x81";
  WsFrame frame;
  std::string why;
  ASSERT_EQ(TakeWebSocketFrame(in, 1024, &frame, &why), ParseResult::kDone);
  EXPECT_EQ(frame.opcode, kWsClose);
  EXPECT_EQ(frame.payload, std::string("\x03\xe8", 2));
  EXPECT_EQ(TakeWebSocketFrame(in, 1024, &frame, &why), ParseResult::kNeedMore);
  std::string unmasked = "\x81\x01x";
  EXPECT_EQ(TakeWebSocketFrame(unmasked, 1024, &frame, &why), ParseResult::kError);
  std::string huge = std::string("\x81\xff", 2) + std::string("\x00\x00\x00\x01\x00\x00\x00\x00", 8);
  EXPECT_EQ(TakeWebSocketFrame(huge, 1024, &frame, &why), ParseResult::kError);
}

}  // namespace
}  // namespace torus
