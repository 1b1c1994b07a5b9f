#include "head/serve_http.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace torus {
namespace {

// The message of a refused config ("" when it was taken).
std::string Refusal(const std::string& body) {
  auto r = ValidateServeDeployConfig(body);
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << body;
  return r.status().message();
}

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(ServeDeployConfigTest, TakesRaysConfigsAndNormalizesThem) {
  auto r = ValidateServeDeployConfig(R"({"proxy_location": "EveryNode",
      "http_options": {"port": 8000, "host": "0.0.0.0"},
      "applications": [
        {"name": "a", "route_prefix": "/a", "import_path": "pkg.mod:app", "runtime_env": {},
         "args": {"x": 1}, "deployments": [{"name": "D", "num_replicas": 2}]},
        {"name": "b", "route_prefix": null, "import_path": "pkg.mod.app"},
        {"import_path": "m:app"}]})");
  ASSERT_TRUE(r.ok()) << r.status().message();
  // Sorted keys, no spaces: the same text for the same config.
  EXPECT_EQ(r->rfind(R"({"applications":[{"args":{"x":1},"deployments":[{"name":"D",)", 0), 0u) << *r;
  EXPECT_TRUE(ValidateServeDeployConfig("{}").ok());  // no applications: none wanted
  EXPECT_TRUE(ValidateServeDeployConfig(R"({"applications": []})").ok());
}

TEST(ServeDeployConfigTest, RefusalsNameWhatIsWrong) {
  EXPECT_TRUE(Contains(Refusal("[1]"), "must be a JSON object"));
  EXPECT_TRUE(Contains(Refusal("{"), "the request body"));
  EXPECT_TRUE(Contains(Refusal(std::string(100, '[') + std::string(100, ']')), "deeper than 64"));
  EXPECT_TRUE(Contains(Refusal(R"({"applications": {"a": 1}})"), "applications must be a list"));
  EXPECT_TRUE(
      Contains(Refusal(R"({"applications": [{"import_path": "m:a"}, 3]})"), "applications[1] must be an object"));
  EXPECT_TRUE(Contains(Refusal(R"({"_shutdown": true})"), "'_shutdown'"));
  for (const char* bad : {R"("")", R"("module")", R"("a:b:c")", R"(":app")", R"("mod:")", R"(".app")", R"("mod.")",
                          R"("mod :app")", "7", "null"}) {
    std::string body =
        std::string(R"({"applications": [{"name": "x", "import_path": "m:a"}, {"import_path": )") + bad + "}]}";
    const std::string want = R"(applications[1].import_path must be a non-empty string "module:attribute")";
    EXPECT_EQ(Refusal(body).rfind(want, 0), 0u) << bad << ": " << Refusal(body);
  }
  EXPECT_TRUE(Contains(Refusal(R"({"applications": [{}]})"), "applications[0].import_path must be a non-empty string"));
  EXPECT_TRUE(Contains(Refusal(R"({"applications": [{"import_path": "m:a", "name": ""}]})"), "applications[0].name"));
  EXPECT_TRUE(Contains(Refusal(R"({"applications": [{"import_path": "m:a", "route_prefix": "a"}]})"),
                       "applications[0].route_prefix"));
  EXPECT_TRUE(Contains(Refusal(R"({"applications": [{"import_path": "m:a", "route_prefix": "/a/"}]})"),
                       "applications[0].route_prefix"));
  EXPECT_TRUE(Contains(Refusal(R"({"applications": [{"import_path": "m:a", "args": [1]}]})"),
                       "applications[0].args must be an object"));
  EXPECT_TRUE(Contains(Refusal(R"({"applications": [{"import_path": "m:a", "deployments": [1]}]})"),
                       "applications[0].deployments[0] must be an object"));
}

TEST(ServeDeployConfigTest, NamesAndRoutePrefixesAreUnique) {
  std::string m = Refusal(R"({"applications": [{"name": "a", "import_path": "m:a", "route_prefix": "/a"},
                                              {"name": "a", "import_path": "m:b", "route_prefix": "/b"}]})");
  EXPECT_TRUE(Contains(m, R"(applications[1].name "a" is also the name of applications[0])")) << m;
  // Unnamed applications are all "default", as in Ray.
  m = Refusal(R"({"applications": [{"import_path": "m:a", "route_prefix": "/a"},
                                   {"import_path": "m:b", "route_prefix": "/b"}]})");
  EXPECT_TRUE(Contains(m, R"(name "default")")) << m;
  // The default route prefix is "/"; null ones (no HTTP route) never clash.
  m = Refusal(R"({"applications": [{"name": "a", "import_path": "m:a"}, {"name": "b", "import_path": "m:b"}]})");
  EXPECT_TRUE(Contains(m, R"(applications[1].route_prefix "/" is also that of applications[0])")) << m;
  EXPECT_EQ(Refusal(R"({"applications": [{"name": "a", "import_path": "m:a", "route_prefix": null},
                                         {"name": "b", "import_path": "m:b", "route_prefix": null}]})"),
            "");
}

TEST(ServeDeployConfigTest, BootstrapCommandQuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(ServeBootstrapCommand(""), "python3 -m torus.serve._private.rest_bootstrap");
  EXPECT_EQ(ServeBootstrapCommand("/opt/venv/bin/python"),
            "/opt/venv/bin/python -m torus.serve._private.rest_bootstrap");
  EXPECT_EQ(ServeBootstrapCommand("/my dir/it's/python"),
            "'/my dir/it'\"'\"'s/python' -m torus.serve._private.rest_bootstrap");
}

class FakeRuntime : public ServeRuntime {
 public:
  bool controller = false;
  bool bootstrap_running = false;
  std::vector<std::string> started;
  bool ControllerLive() override { return ControllerLiveCounted(); }
  bool BootstrapRunning() override { return bootstrap_running; }
  Status StartBootstrap(const std::string& cmd) override {
    started.push_back(cmd);
    bootstrap_running = true;
    return Status::Ok();
  }
  int live_checks_left = -1;  // >= 0: the controller goes after that many more liveness checks
  bool Stopping() override { return false; }
  bool ControllerLiveCounted() {
    if (live_checks_left == 0) controller = false;
    if (live_checks_left > 0) --live_checks_left;
    return controller;
  }
};

struct ServeApiTest : ::testing::Test {
  KvStore kv;
  FakeRuntime* rt = nullptr;
  std::unique_ptr<ServeApi> api;
  void SetUp() override {
    auto fake = std::make_unique<FakeRuntime>();
    rt = fake.get();
    api = std::make_unique<ServeApi>(kv, std::move(fake), "py -m boot", std::chrono::milliseconds(300));
  }
  std::string Kv(const std::string& key) { return kv.Get("serve", key).value_or("<absent>"); }
};

TEST_F(ServeApiTest, EachPutStoresTheConfigBumpsTheVersionAndStartsServeOnce) {
  const std::string cfg = R"({"applications": [{"name": "a", "import_path": "m:app"}]})";
  ASSERT_TRUE(api->Deploy(cfg).ok());
  EXPECT_EQ(Kv("deploy_config"), *ValidateServeDeployConfig(cfg));
  EXPECT_EQ(Kv("deploy_config_version"), "1");
  EXPECT_EQ(rt->started, std::vector<std::string>{"py -m boot"});
  // The bootstrap job still runs: no second one.
  ASSERT_TRUE(api->Deploy("{}").ok());
  EXPECT_EQ(Kv("deploy_config"), "{}");
  EXPECT_EQ(Kv("deploy_config_version"), "2");
  EXPECT_EQ(rt->started.size(), 1u);
  // It ended and the controller lives: none either.
  rt->bootstrap_running = false;
  rt->controller = true;
  ASSERT_TRUE(api->Deploy(cfg).ok());
  EXPECT_EQ(rt->started.size(), 1u);
  // Both gone (the bootstrap failed, or the controller was shut down): started again.
  rt->controller = false;
  ASSERT_TRUE(api->Deploy(cfg).ok());
  EXPECT_EQ(rt->started.size(), 2u);
  EXPECT_EQ(Kv("deploy_config_version"), "4");
}

TEST_F(ServeApiTest, ARefusedPutChangesNothing) {
  auto s = api->Deploy(R"({"applications": [{"import_path": "nocolon"}]})");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Kv("deploy_config"), "<absent>");
  EXPECT_EQ(Kv("deploy_config_version"), "<absent>");
  EXPECT_TRUE(rt->started.empty());
}

TEST_F(ServeApiTest, DeleteStoresTheShutdownConfigWithoutStartingServe) {
  ASSERT_TRUE(kv.Put("serve", "deploy_config_version", "41", true).ok());
  ASSERT_TRUE(api->Shutdown().ok());
  EXPECT_EQ(nlohmann::json::parse(Kv("deploy_config")),
            nlohmann::json::parse(R"({"applications": [], "_shutdown": true})"));
  EXPECT_EQ(Kv("deploy_config_version"), "42");
  EXPECT_TRUE(rt->started.empty());
}

TEST_F(ServeApiTest, DeleteAnswersOnceTheControllerIsGone) {
  rt->controller = true;
  rt->live_checks_left = 3;
  ASSERT_TRUE(api->Shutdown().ok());
  EXPECT_FALSE(rt->controller);
  // A PUT after it starts Serve anew (the old controller cannot take it).
  ASSERT_TRUE(api->Deploy("{}").ok());
  EXPECT_EQ(rt->started.size(), 1u);
  // A controller that does not go: the DELETE answers after the wait.
  rt->controller = true;
  rt->live_checks_left = -1;
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(api->Shutdown().ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
}

TEST_F(ServeApiTest, DetailsAreTheControllersWhileItLives) {
  auto empty = nlohmann::json::parse(kServeEmptyDetails);
  EXPECT_EQ(empty["applications"], nlohmann::json::object());
  EXPECT_TRUE(empty["proxy_location"].is_null());
  EXPECT_EQ(api->Details().value(), kServeEmptyDetails);
  ASSERT_TRUE(kv.Put("serve", "details", R"({"applications": {"a": {}}})", true).ok());
  EXPECT_EQ(api->Details().value(), kServeEmptyDetails);  // stale: no controller
  rt->controller = true;
  EXPECT_EQ(api->Details().value(), R"({"applications": {"a": {}}})");
  ASSERT_TRUE(kv.Del("serve", "details"));
  EXPECT_EQ(api->Details().value(), kServeEmptyDetails);  // not written yet
}

TEST_F(ServeApiTest, ApiTypeKeepsTheApplicationsOfThatSource) {
  rt->controller = true;
  ASSERT_TRUE(kv.Put("serve", "details",
                     R"({"proxies": {}, "applications": {"d": {"source": "declarative"},
                         "i": {"source": "imperative"}}})",
                     true)
                  .ok());
  auto d = api->Details("DECLARATIVE");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(nlohmann::json::parse(*d),
            nlohmann::json::parse(R"({"proxies": {}, "applications": {"d": {"source": "declarative"}}})"));
  EXPECT_EQ(nlohmann::json::parse(api->Details("imperative").value())["applications"].size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(api->Details("").value())["applications"].size(), 2u);
  auto bad = api->Details("unknown");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad.status().message(), "Invalid 'api_type' value: 'unknown'"));
}

TEST_F(ServeApiTest, MetricsAreTheControllersFilteredWhileItLives) {
  EXPECT_EQ(api->Metrics(), "");  // no key, no controller
  ASSERT_TRUE(kv.Put("serve", "metrics", "ray_serve_a 1\ntorus_fake 1\nray_serve_b{x=\"y\"} 2", true).ok());
  EXPECT_EQ(api->Metrics(), "");  // stale: no controller
  rt->controller = true;
  EXPECT_EQ(api->Metrics(), "ray_serve_a 1\nray_serve_b{x=\"y\"} 2\n");
  ASSERT_TRUE(kv.Put("serve", "metrics", "ray_serve_a \xff", true).ok());
  EXPECT_EQ(api->Metrics(), "");  // not UTF-8
  ASSERT_TRUE(kv.Del("serve", "metrics"));
  EXPECT_EQ(api->Metrics(), "");
}

}  // namespace
}  // namespace torus
