#include "common/metrics.h"

#include <prometheus/gauge.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <map>
#include <memory>
#include <sstream>

#include "common/thread_annotations.h"

namespace torus {

prometheus::Registry& ProcessMetrics() {
  static auto* registry = new prometheus::Registry();  // never destroyed: used until exit
  return *registry;
}

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const prometheus::Histogram::BucketBoundaries b = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                            0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                                            1,      2.5,     5,      10,    30,     60};
  return b;
}

GaugeFamily::GaugeFamily(std::string name, std::string help) {
  f_.name = std::move(name);
  f_.help = std::move(help);
  f_.type = prometheus::MetricType::Gauge;
}

void GaugeFamily::Add(double value, const MetricLabels& labels) {
  prometheus::ClientMetric m;
  m.label.reserve(labels.size());
  for (const auto& [k, v] : labels) m.label.push_back({k, v});
  m.gauge.value = value;
  f_.metric.push_back(std::move(m));
}

void CallMetrics::Record(bool succeeded, double seconds) const {
  (succeeded ? ok : failed)->Increment();
  latency->Observe(seconds);
}

namespace {

struct CallFamilies {
  prometheus::Family<prometheus::Counter>& requests =
      prometheus::BuildCounter()
          .Name("torus_rpc_server_requests_total")
          .Help("RPCs served (gRPC and lane), by method and whether they succeeded")
          .Register(ProcessMetrics());
  prometheus::Family<prometheus::Histogram>& latency =
      prometheus::BuildHistogram()
          .Name("torus_rpc_server_latency_seconds")
          .Help("Time to serve an RPC (for a stream: its whole life), by method")
          .Register(ProcessMetrics());
  Mutex mu;
  std::map<std::string, std::unique_ptr<CallMetrics>, std::less<>> by_method GUARDED_BY(mu);
};

CallFamilies& Calls() {
  static auto* c = new CallFamilies();  // never destroyed: its pointers are handed out
  return *c;
}

// "/torus.rpc.Head/Heartbeat" -> "Head.Heartbeat"
std::string MethodLabel(std::string_view method) {
  std::string s(method);
  if (!s.empty() && s[0] == '/') s.erase(0, 1);
  if (s.rfind("torus.rpc.", 0) == 0) s.erase(0, 10);
  for (auto& c : s) {
    if (c == '/') c = '.';
  }
  return s.substr(0, 100);
}

}  // namespace

const CallMetrics* ServedCallMetrics(std::string_view method) {
  auto& c = Calls();
  MutexLock lock(c.mu);
  auto it = c.by_method.find(method);
  if (it != c.by_method.end()) return it->second.get();
  if (c.by_method.size() >= 1000) method = "(other)";  // a bound on the label set
  if (auto o = c.by_method.find(method); o != c.by_method.end()) return o->second.get();
  std::string label = MethodLabel(method);
  auto m = std::make_unique<CallMetrics>();
  m->ok = &c.requests.Add({{"method", label}, {"status", "ok"}});
  m->failed = &c.requests.Add({{"method", label}, {"status", "error"}});
  m->latency = &c.latency.Add({{"method", label}}, LatencyBuckets());
  return c.by_method.emplace(std::string(method), std::move(m)).first->second.get();
}

bool ClaimProcessMetrics() {
  static std::atomic<bool> claimed{false};
  return !claimed.exchange(true);
}

std::string RenderMetrics(MetricFamilies families, bool with_process) {
  if (with_process) {
    for (auto& f : ProcessMetrics().Collect()) families.push_back(std::move(f));
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

void ServeMetrics(HttpServer& server, std::function<MetricFamilies()> collect,
                  std::function<std::string()> append) {
  const bool with_process = ClaimProcessMetrics();
  server.Handle("GET", "/metrics", HttpServer::Access::kToken,
                [collect = std::move(collect), append = std::move(append), with_process](const HttpRequest&) {
                  std::string text = RenderMetrics(collect(), with_process);
                  if (append) text += append();
                  HttpResponse r = HttpResponse::Text(std::move(text));
                  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
                  return r;
                });
}

}  // namespace torus
