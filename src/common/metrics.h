// Metrics in Prometheus's text exposition format (docs/metrics.md), on prometheus-cpp's core
// library (Debian's prometheus-cpp-dev: its metric types, registry and text serializer, so the
// format, escaping and histogram rules are a well-kept library's).
//
// Two kinds:
//  - events (counters, histograms) live in the process's registry (ProcessMetrics()) and are
//    updated where they happen, e.g. every served RPC (ServedCallMetrics);
//  - state (gauges: nodes, actors, slices, store bytes...) is read when scraped, by the object
//    that owns it, into GaugeFamily values.
// A /metrics handler renders both with RenderMetrics.
//
// THREADS: everything here is thread-safe; ServedCallMetrics returns pointers valid for the
// life of the process.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/http_server.h"

namespace torus {

using MetricFamilies = std::vector<prometheus::MetricFamily>;
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// This process's registry of event metrics.
prometheus::Registry& ProcessMetrics();

// Bucket bounds in seconds for latencies: 100 µs to 60 s, about 2.5x apart.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets();

// One gauge family built at scrape time.
class GaugeFamily {
 public:
  GaugeFamily(std::string name, std::string help);
  void Add(double value, const MetricLabels& labels = {});
  prometheus::MetricFamily Take() { return std::move(f_); }

 private:
  prometheus::MetricFamily f_;
};

// The served calls of one method (gRPC or lane): torus_rpc_server_requests_total{method,status}
// and torus_rpc_server_latency_seconds{method}.
struct CallMetrics {
  prometheus::Counter* ok = nullptr;
  prometheus::Counter* failed = nullptr;
  prometheus::Histogram* latency = nullptr;
  void Record(bool succeeded, double seconds) const;
};
// `method` as gRPC names it ("/torus.rpc.Head/Heartbeat"); labelled "Head.Heartbeat".
const CallMetrics* ServedCallMetrics(std::string_view method);

// True for the first caller in the process: the /metrics endpoint that shows the process
// registry (when a head and a node share a process, `--block`, their RPCs are shown once, by
// the one that claimed first, so that summing over targets counts each call once).
bool ClaimProcessMetrics();

// The text exposition of `families`, followed by the process registry's when `with_process`.
std::string RenderMetrics(MetricFamilies families, bool with_process);

// GET /metrics on `server` (token required): `collect`'s state families, and the process
// registry's when this endpoint is the first of the process to claim it (ClaimProcessMetrics),
// then `append`'s text when given: exposition lines the caller vouches for, each ending in '\n',
// whose metric names are none of the families above (the head's: Serve's metrics).
void ServeMetrics(HttpServer& server, std::function<MetricFamilies()> collect,
                  std::function<std::string()> append = nullptr);

}  // namespace torus
