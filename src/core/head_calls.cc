// CoreWorker's calls to the head that are not about tasks or actors: the key-value store, the
// cluster listing, and the command line of Python workers. Each call blocks for one RPC and holds
// no lock of the core worker.
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "common/rpc.h"
#include "core/core_worker.h"
#include "torus/api/exceptions.h"

namespace torus::core {

namespace {
constexpr int kHeadCallMs = 30000;

void Check(const grpc::Status& st, const char* what) {
  if (!st.ok()) {
    throw internal::RayException(std::string(what) + " failed at the head: " + st.error_message());
  }
}
}  // namespace

std::vector<std::string> PythonWorkerCommand(const std::vector<std::string>& given) {
  if (!given.empty()) return given;
  if (const char* env = std::getenv("TORUS_PYTHON_WORKER_COMMAND"); env && *env) {
    auto j = nlohmann::json::parse(env, nullptr, /*allow_exceptions=*/false);
    if (j.is_array() && !j.empty()) {
      std::vector<std::string> out;
      for (const auto& a : j) {
        if (a.is_string()) out.push_back(a.get<std::string>());
      }
      if (out.size() == j.size()) return out;
    }
    std::fprintf(stderr,
                 "torus: ignoring TORUS_PYTHON_WORKER_COMMAND: not a JSON list of strings\n");
  }
  return {"python3", "-m", "torus._private.worker_main"};
}

bool CoreWorker::KvPut(const std::string& ns, const std::string& key, const std::string& value,
                       bool overwrite) {
  rpc::KvPutRequest req;
  req.set_ns(ns);
  req.set_key(key);
  req.set_value(value);
  req.set_overwrite(overwrite);
  rpc::KvPutReply reply;
  auto ctx = NewContext(opts_.token, kHeadCallMs);
  Check(head_->KvPut(ctx.get(), req, &reply), "KV put");
  return reply.added();
}

std::optional<std::string> CoreWorker::KvGet(const std::string& ns, const std::string& key) {
  rpc::KvGetRequest req;
  req.set_ns(ns);
  req.set_key(key);
  rpc::KvGetReply reply;
  auto ctx = NewContext(opts_.token, kHeadCallMs);
  Check(head_->KvGet(ctx.get(), req, &reply), "KV get");
  if (!reply.found()) return std::nullopt;
  return std::move(*reply.mutable_value());
}

bool CoreWorker::KvDel(const std::string& ns, const std::string& key) {
  rpc::KvGetRequest req;
  req.set_ns(ns);
  req.set_key(key);
  rpc::KvPutReply reply;
  auto ctx = NewContext(opts_.token, kHeadCallMs);
  Check(head_->KvDel(ctx.get(), req, &reply), "KV delete");
  return reply.added();
}

std::vector<std::string> CoreWorker::KvKeys(const std::string& ns, const std::string& prefix) {
  rpc::KvGetRequest req;
  req.set_ns(ns);
  req.set_key(prefix);
  rpc::KvKeysReply reply;
  auto ctx = NewContext(opts_.token, kHeadCallMs);
  Check(head_->KvKeys(ctx.get(), req, &reply), "KV keys");
  return {reply.keys().begin(), reply.keys().end()};
}

rpc::ListReply CoreWorker::ListCluster() {
  rpc::ListReply reply;
  auto ctx = NewContext(opts_.token, kHeadCallMs);
  Check(head_->List(ctx.get(), rpc::Empty(), &reply), "listing the cluster");
  return reply;
}

}  // namespace torus::core
