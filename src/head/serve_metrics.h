// Serve's metrics on the head's /metrics (docs/metrics.md): the Serve controller (a Python actor,
// python/torus/serve/_private/metrics.py) writes Prometheus text under Ray's names into the
// head's KV store (namespace "serve", key "metrics"); the head appends what passes this filter
// after its own metrics.
//
// The text comes from user processes (the controller runs in a user's cluster and any driver can
// write the key), so it is a guest in the head's answer: it may add `ray_serve_*` series only,
// never a `torus_*` one, and a line that Prometheus could not parse is dropped rather than
// allowed to fail the whole scrape (a parse error makes Prometheus discard every sample of it).
//
// THREADS: pure functions, callable from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace torus {

inline constexpr const char* kServeMetricsKey = "metrics";  // in namespace "serve"
inline constexpr std::string_view kServeMetricPrefix = "ray_serve_";
// A bigger value is not shown at all (Serve's own text is some KiB per deployment).
inline constexpr size_t kServeMetricsMaxBytes = 4u << 20;

struct ServeMetricsText {
  // The lines kept, each ending in '\n' ("" when none were).
  std::string text;
  // Lines (non-empty) that were not kept.
  size_t dropped_lines = 0;
  // Why the whole value was refused ("" when it was not): over kServeMetricsMaxBytes, or not
  // valid UTF-8.
  std::string refused;
};

// The part of `stored` the head may show. Nothing when it is over kServeMetricsMaxBytes or not
// valid UTF-8 (strict: no overlong forms, surrogates or code points past U+10FFFF). Otherwise,
// line by line ('\n'; a trailing '\r' is ignored), a non-empty line is kept when it is
//  - `# HELP name text` (text escaped: \\ and \n only) or `# TYPE name counter|gauge|
//    histogram|summary|untyped`, with `name` starting with "ray_serve_", the first HELP (TYPE)
//    line of that name; or
//  - a sample of the text format 0.0.4: `name{label="value",...} value [timestamp]` spaced as
//    Prometheus's clients write it (nothing between the name and `{` nor inside the braces,
//    blanks between the fields, none at the end), `name` starting with "ray_serve_", labels
//    optional (`{}` and a trailing comma too), each label name once and none
//    starting with "__" (Prometheus's own: `__name__` would rename the series), label values
//    escaped as the format says (\\ \" \n only), the value a decimal number, NaN or [+-]Inf
//    (any case, "Infinity" too, as Prometheus's parser takes them), the timestamp whole
//    milliseconds.
// Every other non-empty line (other comments, other names, anything malformed) is dropped.
ServeMetricsText FilterServeMetrics(std::string_view stored);

}  // namespace torus
