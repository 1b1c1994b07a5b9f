// The Head's KV-store RPCs (head/kv_store.h): token check, then the store.
#include "common/rpc.h"
#include "head/head.h"

namespace torus {

grpc::Status Head::KvPut(grpc::ServerContext* ctx, const rpc::KvPutRequest* req,
                         rpc::KvPutReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  auto added = kv_.Put(req->ns(), req->key(), req->value(), req->overwrite());
  if (!added.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, added.status().message());
  reply->set_added(*added);
  return grpc::Status::OK;
}

grpc::Status Head::KvGet(grpc::ServerContext* ctx, const rpc::KvGetRequest* req,
                         rpc::KvGetReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  auto v = kv_.Get(req->ns(), req->key());
  reply->set_found(v.has_value());
  if (v) reply->set_value(std::move(*v));
  return grpc::Status::OK;
}

grpc::Status Head::KvDel(grpc::ServerContext* ctx, const rpc::KvGetRequest* req,
                         rpc::KvPutReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  reply->set_added(kv_.Del(req->ns(), req->key()));
  return grpc::Status::OK;
}

grpc::Status Head::KvKeys(grpc::ServerContext* ctx, const rpc::KvGetRequest* req,
                          rpc::KvKeysReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  for (auto& k : kv_.Keys(req->ns(), req->key())) reply->add_keys(std::move(k));
  return grpc::Status::OK;
}

}  // namespace torus
