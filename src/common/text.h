// Small ASCII text helpers shared by the parsers of flags, labels, environment variables and
// topologies. Pure functions, thread-safe.
#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace torus {

// `s` without leading and trailing whitespace (a view into `s`).
inline std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// `s` with ASCII letters in lower case.
inline std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

}  // namespace torus
