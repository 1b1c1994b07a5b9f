#include "head/bundle_calls.h"

#include <cstring>
#include <memory>

#include "common/lane.h"
#include "common/rpc.h"

namespace torus {

using wire::PutBytes;
using wire::PutTag;
using wire::PutVarint;

std::string BundlesPayload(const rpc::PlacementGroupRecord& rec, const std::vector<int>& which) {
  std::string out;
  PutBytes(&out, rpc::BundlesRequest::kPgIdFieldNumber, rec.pg_id());
  for (int i : which) {
    const rpc::Bundle& b = rec.bundles(i);
    PutTag(&out, rpc::BundlesRequest::kBundlesFieldNumber, 2);
    PutVarint(&out, b.ByteSizeLong());
    b.AppendPartialToString(&out);
  }
  PutTag(&out, rpc::BundlesRequest::kCommitFieldNumber, 0);
  PutVarint(&out, 1);
  return out;
}

std::string ReleasePayload(const std::string& pg_id, const std::vector<int>& indexes, const std::string& reason) {
  std::string out;
  PutBytes(&out, rpc::BundlesRequest::kPgIdFieldNumber, pg_id);
  for (int index : indexes) {
    std::string b;
    if (index != 0) {
      PutTag(&b, rpc::Bundle::kIndexFieldNumber, 0);
      PutVarint(&b, static_cast<uint64_t>(static_cast<int64_t>(index)));
    }
    PutBytes(&out, rpc::BundlesRequest::kBundlesFieldNumber, b);
  }
  if (!reason.empty()) PutBytes(&out, rpc::BundlesRequest::kReasonFieldNumber, reason);
  return out;
}

std::string AddressedPayload(const NodeCall& c) {
  std::string out = c.payload;
  // A field appended to a serialized message is read as if it had been written with the rest.
  if (!c.node_id.empty()) PutBytes(&out, rpc::BundlesRequest::kNodeIdFieldNumber, c.node_id);
  return out;
}

namespace {
// Protobuf wire-format reading for the bundle replies.
bool ReadVarint(const char*& p, const char* end, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    uint8_t b = static_cast<uint8_t>(*p++);
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}
// A length-delimited field's bytes [*begin, *begin + *size) in [p, end); moves p past them.
bool ReadLength(const char*& p, const char* end, const char** begin, size_t* size) {
  uint64_t n;
  if (!ReadVarint(p, end, &n) || n > static_cast<uint64_t>(end - p)) return false;
  *begin = p;
  *size = static_cast<size_t>(n);
  p += n;
  return true;
}
// Skips a field of wire type `wt` (not a group).
bool SkipField(const char*& p, const char* end, int wt) {
  uint64_t v;
  const char* b;
  size_t n;
  switch (wt) {
    case 0: return ReadVarint(p, end, &v);
    case 1: if (end - p < 8) return false; p += 8; return true;
    case 2: return ReadLength(p, end, &b, &n);
    case 5: if (end - p < 4) return false; p += 4; return true;
    default: return false;
  }
}
}  // namespace

bool ParseBundleReply(BundleReply* r) {
  using R = rpc::PrepareBundlesReply;
  const char* base = r->raw.data();
  const char* p = base;
  const char* end = base + r->raw.size();
  while (p < end) {
    uint64_t tag;
    if (!ReadVarint(p, end, &tag)) return false;
    int field = static_cast<int>(tag >> 3), wt = static_cast<int>(tag & 7);
    uint64_t v;
    const char* b;
    size_t n;
    if (field == R::kOkFieldNumber && wt == 0) {
      if (!ReadVarint(p, end, &v)) return false;
      r->ok = v != 0;
    } else if (field == R::kErrorFieldNumber && wt == 2) {
      if (!ReadLength(p, end, &b, &n)) return false;
      r->error.assign(b, n);
    } else if (field == R::kLedgerSeqFieldNumber && wt == 0) {
      if (!ReadVarint(p, end, &r->ledger_seq)) return false;
    } else if (field == R::kAvailableFieldNumber && wt == 2) {
      if (!ReadLength(p, end, &b, &n)) return false;
      const char* q = b;
      const char* qend = b + n;
      while (q < qend) {  // rpc::ResourceSet
        if (!ReadVarint(q, qend, &tag)) return false;
        const int set_field = static_cast<int>(tag >> 3);
        const bool units = set_field == rpc::ResourceSet::kUnitsFieldNumber;
        if ((!units && set_field != rpc::ResourceSet::kLegacyAmountsFieldNumber) || (tag & 7) != 2) {
          if (!SkipField(q, qend, static_cast<int>(tag & 7))) return false;
          continue;
        }
        const char* e;
        size_t en;
        if (!ReadLength(q, qend, &e, &en)) return false;
        BundleReply::Amount a;
        const char* x = e;
        const char* xend = e + en;
        while (x < xend) {  // one map entry: key = name, value = amount
          if (!ReadVarint(x, xend, &tag)) return false;
          int f = static_cast<int>(tag >> 3), t = static_cast<int>(tag & 7);
          if (f == wire::kMapKeyField && t == 2) {
            const char* kb;
            size_t kn;
            if (!ReadLength(x, xend, &kb, &kn)) return false;
            a.name_offset = static_cast<uint32_t>(kb - base);
            a.name_size = static_cast<uint32_t>(kn);
          } else if (f == wire::kMapValueField && t == 0 && units) {
            uint64_t u;
            if (!ReadVarint(x, xend, &u)) return false;
            a.units = static_cast<int64_t>(u);  // int64: two's complement in a varint
          } else if (f == wire::kMapValueField && t == 1 && !units) {  // an older node's double
            if (xend - x < 8) return false;
            double d;
            memcpy(&d, x, 8);
            a.units = ResourceAmount(d).units();
            x += 8;
          } else if (!SkipField(x, xend, t)) {
            return false;
          }
        }
        r->available.push_back(a);
      }
    } else if (!SkipField(p, end, wt)) {
      return false;
    }
  }
  return true;
}


namespace {
const char* MethodOf(BundleOp op) {
  return op == BundleOp::kPrepare ? "/torus.rpc.Node/PrepareBundles" : "/torus.rpc.Node/ReleaseBundles";
}

// The calls not done over the lane (a node in this process, or one without a lane): as
// messages, directly to a node in this process, else over gRPC, concurrently. Each reply is
// left serialised in out[i].raw, as a lane reply is.
void CallOffLane(const std::string& token, BundleOp op, const std::vector<NodeCall>& calls,
                 std::vector<bool>* done, std::vector<BundleReply>* out) {
  const char* method = MethodOf(op);
  struct InFlight {
    rpc::BundlesRequest req;
    rpc::PrepareBundlesReply reply;
    std::unique_ptr<rpc::Node::Stub> stub;
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientAsyncResponseReader<rpc::PrepareBundlesReply>> reader;
  };
  std::vector<InFlight> inflight(calls.size());
  grpc::CompletionQueue cq;
  int outstanding = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    if ((*done)[i]) continue;
    const auto& addr = calls[i].address;
    grpc::Status& st = (*out)[i].status;
    auto& f = inflight[i];
    rpc::BundlesRequest& req = f.req;
    rpc::PrepareBundlesReply& reply = f.reply;
    if (!req.ParseFromString(AddressedPayload(calls[i]))) {
      st = grpc::Status(grpc::StatusCode::INTERNAL, std::string("unparsable bundle request for ") + method);
      (*done)[i] = true;
      continue;
    }
    if (auto* node = dynamic_cast<rpc::Node::Service*>(InProcessServiceAt(addr))) {
      // A node in this process: call it directly.
      DirectCallScope scope;
      grpc::ServerContext sctx;
      st = op == BundleOp::kPrepare ? node->PrepareBundles(&sctx, &req, &reply)
                                    : node->ReleaseBundles(&sctx, &req, &reply);
      continue;
    }
    f.stub = rpc::Node::NewStub(GetChannel(addr));
    f.ctx = NewContext(token, 5000);
    f.reader = op == BundleOp::kPrepare ? f.stub->AsyncPrepareBundles(f.ctx.get(), req, &cq)
                                        : f.stub->AsyncReleaseBundles(f.ctx.get(), req, &cq);
    f.reader->Finish(&reply, &st, reinterpret_cast<void*>(i));
    ++outstanding;
  }
  // Every call carries a deadline, so each completes.
  void* tag;
  bool ok;
  while (outstanding > 0 && cq.Next(&tag, &ok)) --outstanding;
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    if (!(*done)[i] && (*out)[i].status.ok()) (*out)[i].raw = inflight[i].reply.SerializeAsString();
  }
}
}  // namespace

std::vector<BundleReply> CallNodes(const std::string& token, BundleOp op, const std::vector<NodeCall>& calls) {
  std::vector<BundleReply> out(calls.size());
  // Nodes with a lane (every real node): one batch, all requests sent before any reply is read.
  const char* method = MethodOf(op);
  std::vector<LaneRequest> lane_reqs;
  std::vector<size_t> lane_index;
  std::vector<bool> done(calls.size(), false);
  for (size_t i = 0; i < calls.size(); ++i) {
    const auto& addr = calls[i].address;
    if (InProcessServiceAt(addr) || !HasLane(addr, token)) continue;
    lane_reqs.push_back({addr, method, AddressedPayload(calls[i])});
    lane_index.push_back(i);
  }
  size_t left = calls.size();
  if (!lane_reqs.empty()) {
    auto results = LaneCallMany(token, lane_reqs, 5000);
    for (size_t k = 0; k < results.size(); ++k) {
      if (!results[k].delivered) continue;  // no lane after all: gRPC below
      auto& r = out[lane_index[k]];
      r.status = results[k].status;
      r.raw = std::move(results[k].reply);
      done[lane_index[k]] = true;
      --left;
    }
  }
  if (left > 0) CallOffLane(token, op, calls, &done, &out);
  for (size_t i = 0; i < calls.size(); ++i) {
    BundleReply& r = out[i];
    if (r.status.ok() && !ParseBundleReply(&r)) {
      r.status = grpc::Status(grpc::StatusCode::INTERNAL, std::string("garbled reply to ") + method);
    }
  }
  return out;
}

}  // namespace torus
