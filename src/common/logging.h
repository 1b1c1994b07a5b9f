// Minimal leveled logging to stderr (each daemon's stderr is its log file in the session dir).
//   TORUS_LOG(INFO) << "node " << id << " registered";
// Level from TORUS_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR); default INFO. Thread-safe per line.
#pragma once
#include <sstream>
#include <string>

namespace torus {

enum class LogLevel { DEBUG = 0, INFO = 1, WARNING = 2, ERROR = 3 };

// Sets the component name printed on every line ("head", "node", "worker", "driver").
void SetLogComponent(std::string name);
bool LogEnabled(LogLevel level);
// Default minimum level when TORUS_LOG_LEVEL is unset (drivers keep their terminal quiet).
void SetDefaultLogLevel(LogLevel level);

class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  std::ostream& stream() { return os_; }

 private:
  LogLevel level_;
  std::ostringstream os_;
};

}  // namespace torus

#define TORUS_LOG(level)                                                              \
  for (bool torus_log_once_ = ::torus::LogEnabled(::torus::LogLevel::level); torus_log_once_; \
       torus_log_once_ = false)                                                       \
  ::torus::LogLine(::torus::LogLevel::level, __FILE__, __LINE__).stream()
