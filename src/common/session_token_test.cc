// The one rule for a cluster token wherever it is read (common/session.h CleanToken).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/session.h"

namespace torus {
namespace {

const std::string kCleanToken = "0123456789abcdef0123456789abcdef";

// Issue 41: a Kubernetes secret ends in a newline; gRPC aborted on it and printed the token.
TEST(SessionTokenTest, SurroundingWhitespaceIsStripped) {
  for (const std::string& raw : {kCleanToken + "\n", kCleanToken + "\r\n", " \t" + kCleanToken + " \n\v\f", kCleanToken}) {
    auto t = CleanToken(raw, "TORUS_TOKEN");
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(*t, kCleanToken);
  }
}

TEST(SessionTokenTest, ControlCharactersAndNonAsciiAreRefusedWithoutEchoingTheToken) {
  auto t = CleanToken(kCleanToken.substr(0, 5) + "\x07" + kCleanToken.substr(5) + "\n", "TORUS_TOKEN");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(t.status().message(),
            "the cluster token in TORUS_TOKEN contains a control character (byte 0x07 at offset 5); "
            "tokens are printable ASCII");
  t = CleanToken(kCleanToken.substr(0, 16) + "\n" + kCleanToken.substr(16), "RAY_AUTH_TOKEN");  // inside: refused
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("byte 0x0a at offset 16"), std::string::npos) << t.status().message();
  t = CleanToken(kCleanToken + "\x7f", "x");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("a control character (byte 0x7f at offset 32)"), std::string::npos);
  t = CleanToken(kCleanToken.substr(0, 3) + "\xc3\xa9" + kCleanToken.substr(3), "x");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("a byte that is not ASCII (byte 0xc3 at offset 3)"), std::string::npos);
  EXPECT_EQ(t.status().message().find(kCleanToken.substr(3, 8)), std::string::npos);
}

TEST(SessionTokenTest, EmptyAndShortTokensAreRefusedNamingTheSource) {
  auto t = CleanToken(" \n", "the token file /s/token");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "no cluster token: the token file /s/token is empty");
  t = CleanToken("abc\n", "TORUS_TOKEN");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("too short (3 characters"), std::string::npos);
  EXPECT_TRUE(ValidateToken(kCleanToken, "x").ok());
  EXPECT_FALSE(ValidateToken(kCleanToken + "\n", "x").ok());  // validated as given: no stripping
}

TEST(SessionTokenTest, FindTokenCleansTorusToken) {
  const char* old = std::getenv("TORUS_TOKEN");
  const std::string saved = old ? old : "";
  setenv("TORUS_TOKEN", (kCleanToken + "\n").c_str(), 1);
  auto t = FindToken("/nonexistent");
  setenv("TORUS_TOKEN", (kCleanToken + "\a").c_str(), 1);
  auto bad = FindToken("/nonexistent");
  if (old) {
    setenv("TORUS_TOKEN", saved.c_str(), 1);
  } else {
    unsetenv("TORUS_TOKEN");
  }
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(*t, kCleanToken);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("TORUS_TOKEN contains a control character (byte 0x07 at offset 32)"),
            std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace torus
