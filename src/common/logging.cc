#include "common/logging.h"

#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace torus {

namespace {
std::string& Component() {
  static std::string c = "torus";
  return c;
}
LogLevel g_default_level = LogLevel::INFO;
LogLevel MinLevel() {
  static LogLevel level = [] {
    const char* e = std::getenv("TORUS_LOG_LEVEL");
    if (!e) return g_default_level;
    if (!strcasecmp(e, "DEBUG")) return LogLevel::DEBUG;
    if (!strcasecmp(e, "WARNING")) return LogLevel::WARNING;
    if (!strcasecmp(e, "ERROR")) return LogLevel::ERROR;
    return LogLevel::INFO;
  }();
  return level;
}
const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::DEBUG: return "D";
    case LogLevel::INFO: return "I";
    case LogLevel::WARNING: return "W";
    case LogLevel::ERROR: return "E";
  }
  return "?";
}
}  // namespace

void SetLogComponent(std::string name) { Component() = std::move(name); }
void SetDefaultLogLevel(LogLevel level) { g_default_level = level; }
bool LogEnabled(LogLevel level) { return level >= MinLevel(); }

LogLine::LogLine(LogLevel level, const char* file, int line) : level_(level) {
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm t;
  localtime_r(&tv.tv_sec, &t);
  char buf[64];
  strftime(buf, sizeof buf, "%H:%M:%S", &t);
  const char* base = strrchr(file, '/');
  os_ << LevelName(level_) << " " << buf << "." << (tv.tv_usec / 1000) << " " << Component() << "["
      << getpid() << "] " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogLine::~LogLine() {
  os_ << '\n';
  std::string s = os_.str();
  (void)!write(STDERR_FILENO, s.data(), s.size());
}

}  // namespace torus
