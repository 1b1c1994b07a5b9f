#include "head/serve_metrics.h"

#include <gtest/gtest.h>

#include <string>

namespace torus {
namespace {

std::string Kept(const std::string& text) { return FilterServeMetrics(text).text; }

// What python/torus/serve/_private/metrics.py renders: HELP and TYPE once per name, labels
// sorted, `{}` for none, Python's "%g" numbers (1e+06, inf, nan).
TEST(ServeMetricsFilterTest, KeepsWhatTheControllerWrites) {
  const std::string text =
      "# HELP ray_serve_deployment_processing_latency_ms Time a replica took for a request (ms).\n"
      "# TYPE ray_serve_deployment_processing_latency_ms histogram\n"
      "ray_serve_deployment_processing_latency_ms_bucket{application=\"app\",deployment=\"f\",le=\"1\"} 0\n"
      "ray_serve_deployment_processing_latency_ms_bucket{application=\"app\",deployment=\"f\",le=\"+Inf\"} 3\n"
      "ray_serve_deployment_processing_latency_ms_sum{application=\"app\",deployment=\"f\"} 7.25\n"
      "ray_serve_deployment_processing_latency_ms_count{application=\"app\",deployment=\"f\"} 3\n"
      "# HELP ray_serve_num_http_requests_total HTTP requests the proxies answered.\n"
      "# TYPE ray_serve_num_http_requests_total counter\n"
      "ray_serve_num_http_requests_total{route=\"/x\",status_code=\"200\"} 1e+06\n"
      "ray_serve_num_http_requests_total{} 12\n"
      "ray_serve_replica_processing_queries{replica=\"a\\\\b \\\"q\\\" \\n\"} inf\n"
      "ray_serve_x -Inf\n"
      "ray_serve_x nan\n"
      "ray_serve_x{a=\"b\",} +1.5E-3 1700000000000\n"
      "ray_serve_x{a=\"b\"}\t2\t-5\n"
      "ray_serve_x{app=\"日本 é 😀\"} .5\n";
  auto r = FilterServeMetrics(text);
  EXPECT_EQ(r.text, text);
  EXPECT_EQ(r.dropped_lines, 0u);
  EXPECT_EQ(r.refused, "");
}

TEST(ServeMetricsFilterTest, OnlyServesNamesGetIn) {
  auto r = FilterServeMetrics(
      "torus_fake 1\n"
      "torus_nodes{state=\"alive\"} 100\n"
      "# HELP torus_nodes forged\n"
      "# TYPE torus_fake gauge\n"
      "process_cpu_seconds_total 3\n"
      "ray_serve 1\n"
      "ray_serve_ok 1\n"
      "ray_serve_x{__name__=\"torus_fake\"} 1\n"  // would rename the series
      "ray_servex 1\n"
      "# a comment\n"
      "#HELP ray_serve_ok no space\n");
  EXPECT_EQ(r.text, "ray_serve_ok 1\n");
  EXPECT_EQ(r.dropped_lines, 10u);
}

TEST(ServeMetricsFilterTest, DropsLinesPrometheusCouldNotParse) {
  for (const char* bad : {
           "ray_serve_x",                          // no value
           "ray_serve_x{",                          // unclosed labels
           "ray_serve_x{a=\"b} 1",                  // unclosed value
           "ray_serve_x{a=b} 1",                    // unquoted value
           "ray_serve_x{a=\"\\q\"} 1",              // unknown escape
           "ray_serve_x{a=\"1\",a=\"2\"} 1",        // repeated label
           "ray_serve_x{1a=\"b\"} 1",               // bad label name
           "ray_serve_x{a=\"b\" c=\"d\"} 1",        // no comma
           "ray_serve_x{a:b=\"c\"} 1",              // ':' is for metric names only
           "ray_serve_x-y 1",                       // bad metric name
           "ray_serve_x abc",                       // not a number
           "ray_serve_x 0x10",                      // hexadecimal
           "ray_serve_x 1e",                        // no exponent
           "ray_serve_x .",                         // no digits
           "ray_serve_x +nan",                      // Go takes no signed NaN
           "ray_serve_x 1 1.5",                     // fractional timestamp
           "ray_serve_x 1 2 3",                     // trailing field
           "ray_serve_x{a=\"b\"}1",                 // no blank before the value
           " ray_serve_x 1",                        // leading blank
           "# TYPE ray_serve_x kind",               // unknown type
           "# TYPE ray_serve_x gauge extra",        // trailing field
           "# TYPE ray_serve_x",                    // no type
           "# HELP ray_serve_x bad \\t escape",     // HELP escapes are \\ and \n only
           "# HELP ray_serve_x trailing \\",        // a lone backslash
           "# HELPS ray_serve_x x",                 // not HELP
           "# HELP ray_serve_x",                    // no text
           "# TYPE ray_serve_x gauge ",             // trailing blank
           "ray_serve_x 1 ",                        // trailing blank
           "ray_serve_x {a=\"b\"} 1",              // blank before the labels
           "ray_serve_x{ a=\"b\"} 1",              // blank inside them
       }) {
    auto r = FilterServeMetrics(std::string(bad) + "\nray_serve_ok 1\n");
    EXPECT_EQ(r.text, "ray_serve_ok 1\n") << bad;
    EXPECT_EQ(r.dropped_lines, 1u) << bad;
  }
}

// A raw newline inside a label value splits the line: neither half gets in (the second would
// otherwise be a forged series).
TEST(ServeMetricsFilterTest, ARawNewlineCannotSmuggleASeries) {
  auto r = FilterServeMetrics("ray_serve_x{a=\"b\ntorus_fake 1\n\"} 1\n");
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.dropped_lines, 3u);
}

// Prometheus's parsers refuse a second HELP or TYPE line of a name.
TEST(ServeMetricsFilterTest, HelpAndTypeOncePerName) {
  auto r = FilterServeMetrics(
      "# HELP ray_serve_x one\n# TYPE ray_serve_x gauge\n# HELP ray_serve_x two\n"
      "# TYPE ray_serve_x counter\nray_serve_x 1\n# HELP ray_serve_y y\n# TYPE ray_serve_y untyped\n");
  EXPECT_EQ(r.text, "# HELP ray_serve_x one\n# TYPE ray_serve_x gauge\nray_serve_x 1\n"
                    "# HELP ray_serve_y y\n# TYPE ray_serve_y untyped\n");
  EXPECT_EQ(r.dropped_lines, 2u);
}

TEST(ServeMetricsFilterTest, LinesEndInANewlineAndBlankOnesGo) {
  EXPECT_EQ(Kept("ray_serve_a 1"), "ray_serve_a 1\n");
  EXPECT_EQ(Kept("\n\nray_serve_a 1\r\n\r\nray_serve_b 2\r\n"), "ray_serve_a 1\nray_serve_b 2\n");
  EXPECT_EQ(FilterServeMetrics("\n\r\n\n").dropped_lines, 0u);
  EXPECT_EQ(Kept(""), "");
}

TEST(ServeMetricsFilterTest, TheWholeValueMustBeUtf8) {
  for (const char* bad : {"\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80", "\xF0\x80\x80\x80",
                          "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\xE6\x97", "\x80", "\xFF"}) {
    // In a label value of a line that is otherwise fine, and next to lines that are.
    auto r = FilterServeMetrics("ray_serve_ok 1\nray_serve_x{a=\"" + std::string(bad) + "\"} 1\n");
    EXPECT_EQ(r.text, "") << testing::PrintToString(bad);
    EXPECT_EQ(r.refused, "not valid UTF-8");
  }
  EXPECT_EQ(Kept("ray_serve_x{a=\"\xF4\x8F\xBF\xBF \xEF\xBF\xBF \xC2\x80\"} 1\n"),
            "ray_serve_x{a=\"\xF4\x8F\xBF\xBF \xEF\xBF\xBF \xC2\x80\"} 1\n");  // the largest and smallest
}

TEST(ServeMetricsFilterTest, AtMostFourMiB) {
  const std::string line = "ray_serve_x 1\n";
  std::string text;
  while (text.size() + line.size() <= kServeMetricsMaxBytes) text += line;
  text += std::string(kServeMetricsMaxBytes - text.size(), '\n');
  ASSERT_EQ(text.size(), kServeMetricsMaxBytes);
  auto r = FilterServeMetrics(text);
  EXPECT_EQ(r.refused, "");
  EXPECT_EQ(r.text.size(), text.size() / line.size() * line.size());
  text += "\n";
  r = FilterServeMetrics(text);
  EXPECT_EQ(r.text, "");
  EXPECT_NE(r.refused.find("over the limit of 4194304"), std::string::npos) << r.refused;
}

}  // namespace
}  // namespace torus
