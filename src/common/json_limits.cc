#include "common/json_limits.h"

#include <string>

namespace torus {

Status CheckJsonDepth(std::string_view text, std::string_view what) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote included, ends nothing
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return InvalidArgument(std::string(what) + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                               " levels (the limit for any JSON Torus reads)");
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return Status::Ok();
}

StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view what) {
  if (auto s = CheckJsonDepth(text, what); !s.ok()) return s;
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string(what) + " is not valid JSON (" + e.what() + ")");
  }
}

}  // namespace torus
