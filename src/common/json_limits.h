// Reading JSON that comes from outside the process (HTTP bodies, files, flags, the environment,
// durable state): one depth limit for every such document.
//
// Why: nlohmann::json copies, compares and dumps values recursively, so a document nested some
// thousands deep overflows a small thread stack (an HTTP worker's) the first time it is copied or
// dumped. ParseJson scans the text for its nesting depth first and refuses a deeper document
// before anything is built; the scan itself is a loop, never recursion. JSON that Ray-compatible
// clients send is a few levels deep.
//
// Pure functions, thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "common/status.h"

namespace torus {

// `j` as compact text for an answer: invalid UTF-8 in strings is replaced, never thrown on.
inline std::string JsonText(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Deepest nesting of arrays and objects accepted anywhere (a scalar is depth 0, `{}` and `[1]`
// are depth 1, `{"a": [1]}` is depth 2). docs/http.md documents it.
inline constexpr int kMaxJsonDepth = 64;

// OK when `text` nests no deeper than kMaxJsonDepth; else InvalidArgument
// "<what>: JSON nested deeper than 64 levels". Brackets inside strings (escapes honoured) do not
// count. Looks only at the brackets: a syntax error is ParseJson's to report.
Status CheckJsonDepth(std::string_view text, std::string_view what);

// Parses one JSON document after CheckJsonDepth. InvalidArgument names `what` (e.g. "the request
// body", "--resources") and either the depth or the syntax error (nlohmann's words, which quote
// at most the last token read); nothing is built for a refused document.
StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view what);

}  // namespace torus
