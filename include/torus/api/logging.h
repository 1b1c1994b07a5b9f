// RAYLOG(level) << ...: line-oriented logging to stderr for user code, spelled as in Ray.
//
//   RAYLOG(INFO) << "started " << n << " tasks";
//
// Levels are DEBUG, INFO, WARNING, ERROR and FATAL; FATAL aborts the process after writing.
// The threshold is read once from the environment variable TORUS_LOG_LEVEL (one of the level
// names, case-insensitive; default INFO). Each message is written with a single write so lines
// from concurrent threads do not interleave. Safe to use from any thread.
#pragma once

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <sstream>
#include <string>

// Bazel builds define DEBUG=1, which would turn RayLoggerLevel::DEBUG into RayLoggerLevel::1.
// Ray's headers neutralise it the same way; keep `#ifdef DEBUG` working for the user.
#if defined(DEBUG) && DEBUG == 1
#undef DEBUG
#define DEBUG DEBUG
#endif

namespace torus {

enum class RayLoggerLevel { DEBUG = -1, INFO = 0, WARNING = 1, ERROR = 2, FATAL = 3 };

namespace internal {

inline RayLoggerLevel LogThresholdFromEnv() {
  const char* env = std::getenv("TORUS_LOG_LEVEL");
  if (env == nullptr) return RayLoggerLevel::INFO;
  std::string value;
  for (const char* c = env; *c != '\0'; ++c) {
    value += static_cast<char>(std::toupper(static_cast<unsigned char>(*c)));
  }
  if (value == "DEBUG") return RayLoggerLevel::DEBUG;
  if (value == "WARNING") return RayLoggerLevel::WARNING;
  if (value == "ERROR") return RayLoggerLevel::ERROR;
  if (value == "FATAL") return RayLoggerLevel::FATAL;
  return RayLoggerLevel::INFO;
}

inline const char* LevelName(RayLoggerLevel level) {
  switch (level) {
    case RayLoggerLevel::DEBUG: return "D";
    case RayLoggerLevel::INFO: return "I";
    case RayLoggerLevel::WARNING: return "W";
    case RayLoggerLevel::ERROR: return "E";
    case RayLoggerLevel::FATAL: return "F";
  }
  return "?";
}

// One log line. Collects the streamed text and writes it, with a "[L file:line] " prefix, when
// destroyed at the end of the RAYLOG statement.
class LogMessage {
 public:
  LogMessage(const char* file, int line, RayLoggerLevel level) : level_(level) {
    const char* slash = std::strrchr(file, '/');
    stream_ << '[' << LevelName(level) << ' ' << (slash ? slash + 1 : file) << ':' << line << "] ";
  }
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage() {
    stream_ << '\n';
    const std::string text = stream_.str();
    std::fwrite(text.data(), 1, text.size(), stderr);
    if (level_ == RayLoggerLevel::FATAL) {
      std::fflush(stderr);
      std::abort();
    }
  }
  std::ostream& stream() { return stream_; }

 private:
  RayLoggerLevel level_;
  std::ostringstream stream_;
};

}  // namespace internal

// True when messages of `level` are written (FATAL always is).
inline bool IsLevelEnabled(RayLoggerLevel level) {
  static const RayLoggerLevel threshold = internal::LogThresholdFromEnv();
  return level == RayLoggerLevel::FATAL || static_cast<int>(level) >= static_cast<int>(threshold);
}

}  // namespace torus

// The if/else shape keeps a following `else` in user code bound to the user's own `if`.
#define RAYLOG(level)                                                                \
  if (!::torus::IsLevelEnabled(::torus::RayLoggerLevel::level)) {                   \
  } else                                                                            \
    ::torus::internal::LogMessage(__FILE__, __LINE__, ::torus::RayLoggerLevel::level) \
        .stream()
