#include "node/ledger.h"

#include <algorithm>
#include <utility>

#include "common/env_key.h"
#include "common/lane.h"

namespace torus {

namespace {
// One instance per whole GPU of `total`.
std::vector<ResourceAmount> GpuInstances(const ResourceMap& total) {
  auto it = total.find("GPU");
  int n = it == total.end() ? 0 : static_cast<int>(it->second.Whole());
  return std::vector<ResourceAmount>(static_cast<size_t>(std::max(n, 0)), ResourceAmount(1.0));
}
}  // namespace

Ledger::Ledger(std::string node_id, ResourceMap total)
    : node_id_(std::move(node_id)), total_(std::move(total)), available_(total_),
      gpu_free_(GpuInstances(total_)) {}

void Ledger::Reset(ResourceMap total, const std::vector<int>& chip_ids) {
  total_ = std::move(total);
  available_ = total_;
  free_chips_ = std::set<int>(chip_ids.begin(), chip_ids.end());
  gpu_free_ = GpuInstances(total_);
  bundles_.clear();
}

bool Ledger::PickGpus(const ResourceMap& res, std::vector<std::pair<int, ResourceAmount>>* out) const {
  out->clear();
  auto it = res.find("GPU");
  if (it == res.end() || !it->second.Positive() || gpu_free_.empty()) return true;
  const ResourceAmount want = it->second;
  const ResourceAmount one(1.0);
  if (want < one) {
    // A share of one GPU: the fullest instance that still has room (keeps whole ones free).
    int best = -1;
    for (size_t i = 0; i < gpu_free_.size(); ++i) {
      if (want <= gpu_free_[i] && (best < 0 || gpu_free_[i] < gpu_free_[best])) best = static_cast<int>(i);
    }
    if (best < 0) return false;
    out->emplace_back(best, want);
    return true;
  }
  // Whole GPUs (a fractional rest above 1 is not an instance: Ray asks whole numbers there).
  int n = static_cast<int>(want.Whole());
  for (size_t i = 0; i < gpu_free_.size() && static_cast<int>(out->size()) < n; ++i) {
    if (gpu_free_[i] == one) out->emplace_back(static_cast<int>(i), one);
  }
  if (static_cast<int>(out->size()) < n) {
    out->clear();
    return false;
  }
  return true;
}

std::vector<int> Ledger::GpuIds(const Hold& h) {
  std::vector<int> ids;
  for (const auto& [i, share] : h.gpus) ids.push_back(i);
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<int> Ledger::TakeChips(const ResourceMap& res) {
  auto tpu = res.find("TPU");
  int n = tpu == res.end() ? 0 : static_cast<int>(tpu->second.Whole());
  std::vector<int> out;
  // Lowest ids first.
  for (auto it = free_chips_.begin(); it != free_chips_.end() && static_cast<int>(out.size()) < n;) {
    out.push_back(*it);
    it = free_chips_.erase(it);
  }
  return out;
}

void Ledger::Take(ResourceMap* from, const ResourceMap& res, const std::string& pg_id, int bundle,
                  Hold* h) {
  Subtract(*from, res);
  h->res = res;
  h->pg_id = pg_id;
  h->bundle = bundle;
  h->chips = TakeChips(res);
  PickGpus(res, &h->gpus);  // the caller checked that they can be given
  for (const auto& [i, share] : h->gpus) gpu_free_[i] -= share;
  h->held = true;
}

bool Ledger::TakeFromNode(const ResourceMap& res, Hold* h) {
  std::vector<std::pair<int, ResourceAmount>> gpus;
  if (!Fits(res, available_) || !PickGpus(res, &gpus)) return false;
  Take(&available_, res, "", -1, h);
  return true;
}

Ledger::BundleTake Ledger::TakeFromBundle(const std::string& pg_id, int index, const ResourceMap& res,
                                          Hold* h, std::string* error) {
  auto pit = bundles_.find(pg_id);
  if (pit == bundles_.end()) {
    *error = "placement group " + pg_id + " has no bundle on node " + node_id_ +
             " (removed, or not placed here)";
    return BundleTake::kMissing;
  }
  bool any_could = false;
  for (auto& [idx, b] : pit->second) {
    if (index >= 0 && idx != index) continue;
    if (!b.committed) continue;
    if (Fits(res, b.total)) any_could = true;
    std::vector<std::pair<int, ResourceAmount>> gpus;
    if (Fits(res, b.available) && PickGpus(res, &gpus)) {
      Take(&b.available, res, pg_id, idx, h);
      return BundleTake::kTaken;
    }
  }
  if (index >= 0 && !pit->second.count(index)) {
    *error = "bundle " + std::to_string(index) + " of placement group " + pg_id + " is not on node " +
             node_id_;
    return BundleTake::kMissing;
  }
  return any_could ? BundleTake::kWait : BundleTake::kTooBig;
}

Status Ledger::TakeForActor(const std::string& pg_id, int index, const ResourceMap& res, Hold* h) {
  if (!pg_id.empty()) {
    auto pit = bundles_.find(pg_id);
    if (pit != bundles_.end()) {
      for (auto& [idx, b] : pit->second) {
        std::vector<std::pair<int, ResourceAmount>> gpus;
        if ((index < 0 || idx == index) && Fits(res, b.available) && PickGpus(res, &gpus)) {
          // Inside a bundle, only what the actor asked for.
          Take(&b.available, res, pg_id, idx, h);
          return Status::Ok();
        }
      }
    }
    return Status(StatusCode::kResourceExhausted, "no bundle of placement group " + pg_id + " on node " + node_id_ +
                             " has " + ResourcesToString(res));
  }
  // An actor with no explicit resources needs 1 CPU to be placed but holds none while alive.
  ResourceMap placement = res.empty() ? ResourceMap{{"CPU", 1}} : res;
  std::vector<std::pair<int, ResourceAmount>> gpus;
  if (!Fits(placement, available_) || !PickGpus(res, &gpus)) {
    return Status(StatusCode::kResourceExhausted, "node " + node_id_ + " has " + ResourcesToString(available_) +
                             " available, needs " + ResourcesToString(placement));
  }
  Take(&available_, res, "", -1, h);
  return Status::Ok();
}

void Ledger::Return(Hold* h) {
  for (int c : h->chips) free_chips_.insert(c);
  h->chips.clear();
  for (const auto& [i, share] : h->gpus) {
    if (i >= 0 && static_cast<size_t>(i) < gpu_free_.size()) gpu_free_[i] += share;
  }
  h->gpus.clear();
  if (h->held) {
    ResourceMap r = std::move(h->res);
    if (h->blocked) r.erase("CPU");  // already lent back while blocked
    if (!h->pg_id.empty()) {
      auto pit = bundles_.find(h->pg_id);
      if (pit != bundles_.end()) {
        auto bit = pit->second.find(h->bundle);
        if (bit != pit->second.end()) Add(bit->second.available, r);
      }
    } else {
      Add(available_, r);
    }
  }
  h->res.clear();
  h->pg_id.clear();
  h->bundle = -1;
  h->blocked = false;
  h->held = false;
}

void Ledger::Block(Hold* h) {
  if (h->blocked) return;
  auto it = h->res.find("CPU");
  h->blocked = true;
  available_["CPU"] += it == h->res.end() ? ResourceAmount() : it->second;
}

void Ledger::Unblock(Hold* h) {
  if (!h->blocked) return;
  auto it = h->res.find("CPU");
  h->blocked = false;
  available_["CPU"] -= it == h->res.end() ? ResourceAmount() : it->second;
}

std::vector<Ledger::BundleSpec> Ledger::Specs(const rpc::BundlesRequest& req) {
  std::vector<BundleSpec> out;
  out.reserve(req.bundles_size());
  for (const auto& b : req.bundles()) {
    BundleSpec spec;
    spec.index = b.index();
    spec.resources = FromProto(b.resources());
    for (const auto& t : b.label_selector()) spec.label_selector[t.key()] = t.expr();
    spec.env.insert(b.env().begin(), b.env().end());
    spec.env_unset.assign(b.env_unset().begin(), b.env_unset().end());
    out.push_back(std::move(spec));
  }
  return out;
}

bool Ledger::Prepare(const std::string& pg_id, const std::vector<BundleSpec>& bundles, bool commit,
                     const std::map<std::string, std::string>& labels, std::string* error) {
  auto& mine = bundles_[pg_id];
  auto fail = [&](std::string why) {
    if (mine.empty()) bundles_.erase(pg_id);
    *error = std::move(why);
    return false;
  };
  ResourceMap sum;
  for (const auto& b : bundles) {
    if (mine.count(b.index)) continue;  // a repeated prepare
    if (auto s = ValidateResources(ToDoubles(b.resources), "bundle " + std::to_string(b.index)); !s.ok()) {
      return fail(s.message());
    }
    Add(sum, b.resources);
    auto terms = ParseLabelSelector(b.label_selector);
    if (!terms.ok() || !MatchesLabels(*terms, labels)) {
      return fail("bundle " + std::to_string(b.index) + "'s label selector does not match node " + node_id_);
    }
  }
  if (!Fits(sum, available_)) {
    return fail("node " + node_id_ + " has " + ResourcesToString(available_) + " available, the bundles need " +
                ResourcesToString(sum));
  }
  Subtract(available_, sum);
  ++seq_;
  for (const auto& b : bundles) {
    if (mine.count(b.index)) continue;
    Bundle st;
    st.total = b.resources;
    st.available = st.total;
    st.committed = commit;
    st.env = b.env;
    st.env_unset = b.env_unset;
    mine[b.index] = std::move(st);
  }
  return true;
}

bool Ledger::Commit(const std::string& pg_id, const std::vector<int>& indices) {
  auto pit = bundles_.find(pg_id);
  if (pit == bundles_.end()) return false;
  for (int index : indices) {
    auto bit = pit->second.find(index);
    if (bit != pit->second.end()) bit->second.committed = true;
  }
  return true;
}

std::vector<int> Ledger::Release(const std::string& pg_id, const std::vector<int>& indices) {
  std::vector<int> released;
  auto pit = bundles_.find(pg_id);
  if (pit == bundles_.end()) return released;
  ++seq_;
  std::set<int> which(indices.begin(), indices.end());
  for (auto bit = pit->second.begin(); bit != pit->second.end();) {
    if (!which.empty() && !which.count(bit->first)) {
      ++bit;
      continue;
    }
    Add(available_, bit->second.total);
    released.push_back(bit->first);
    bit = pit->second.erase(bit);
  }
  if (pit->second.empty()) bundles_.erase(pit);
  return released;
}

const Ledger::Bundle* Ledger::FindBundle(const std::string& pg_id, int index) const {
  auto pit = bundles_.find(pg_id);
  if (pit == bundles_.end()) return nullptr;
  auto bit = pit->second.find(index);
  return bit == pit->second.end() ? nullptr : &bit->second;
}

std::string Ledger::BundleEnvKey(const std::string& key, const std::string& pg_id, int index) const {
  const Bundle* b = FindBundle(pg_id, index);
  if (!b || (b->env.empty() && b->env_unset.empty())) return key;
  // The variables a bundle sets, then (as "-name" entries: no variable name starts with '-')
  // those it removes; EnvVarsKey is the one encoding of a set of variables in a pool key.
  std::map<std::string, std::string> vars = b->env;
  for (const auto& n : b->env_unset) vars["-" + n] = "";
  return key + EnvVarsKey(vars);
}

void Ledger::FillReply(rpc::PrepareBundlesReply* reply) const {
  ToProto(available_, reply->mutable_available());
  reply->set_ledger_seq(seq_);
}

void Ledger::AppendReply(bool ok, const std::string& error, std::string* out) const {
  // The bytes FillReply's message would serialise to (fields in number order; each map entry
  // as key then value, as protobuf writes them), without building the message.
  using R = rpc::PrepareBundlesReply;
  if (ok) {
    wire::PutTag(out, R::kOkFieldNumber, 0);
    wire::PutVarint(out, 1);
  }
  if (!error.empty()) wire::PutBytes(out, R::kErrorFieldNumber, error);
  thread_local std::string set, entry;
  set.clear();
  for (const auto& [k, v] : available_) {
    entry.clear();
    wire::PutBytes(&entry, wire::kMapKeyField, k);
    wire::PutTag(&entry, wire::kMapValueField, 0);
    wire::PutVarint(&entry, static_cast<uint64_t>(v.units()));  // int64: two's complement
    wire::PutBytes(&set, rpc::ResourceSet::kUnitsFieldNumber, entry);
  }
  wire::PutBytes(out, R::kAvailableFieldNumber, set);
  if (seq_ != 0) {
    wire::PutTag(out, R::kLedgerSeqFieldNumber, 0);
    wire::PutVarint(out, seq_);
  }
}

}  // namespace torus
