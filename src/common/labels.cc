#include "common/labels.h"

#include "common/tpu_labels.h"

namespace torus {

namespace {
std::string Trim(std::string s) {
  while (!s.empty() && isspace(static_cast<unsigned char>(s.front()))) s.erase(s.begin());
  while (!s.empty() && isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

// "a, b" -> {"a", "b"}; empty items are an error.
StatusOr<std::vector<std::string>> SplitList(const std::string& key, const std::string& inner) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= inner.size()) {
    size_t end = inner.find(',', start);
    if (end == std::string::npos) end = inner.size();
    std::string v = Trim(inner.substr(start, end - start));
    if (v.empty()) return InvalidArgument("label selector '" + key + "': empty value in list '" + inner + "'");
    out.push_back(v);
    start = end + 1;
  }
  return out;
}
}  // namespace

bool IsReservedLabelKey(std::string_view key) {
  return key.substr(0, 9) == "torus.io/" || tpu::IsReservedTpuLabelKey(key);
}

Status ValidateUserLabels(const std::map<std::string, std::string>& labels, std::string_view where) {
  for (const auto& [key, value] : labels) {
    if (IsReservedLabelKey(key)) {
      return InvalidArgument(std::string(where) + ": label key '" + key +
                             "' is reserved (torus.io/ keys and the ray.io/ TPU keys are set by "
                             "Torus itself, from the node's identity)");
    }
  }
  return Status::Ok();
}

Status ValidateRegisteredLabels(const std::map<std::string, std::string>& labels,
                                std::string_view node_id, std::string_view hostname) {
  static const std::string_view kNodeSet[] = {
      kLabelNodeId,        kLabelHostname,      kLabelNodeGroup,         tpu::kLabelAcceleratorType,
      tpu::kLabelSliceName, tpu::kLabelWorkerId, tpu::kLabelTopology, tpu::kLabelPodType};
  for (const auto& [key, value] : labels) {
    if (!IsReservedLabelKey(key)) continue;
    bool node_set = false;
    for (auto k : kNodeSet) node_set = node_set || key == k;
    std::string bad;
    if (!node_set) bad = "is reserved and not one the node sets itself";
    if (key == kLabelNodeId && value != node_id) bad = "is '" + value + "', not the node's id";
    if (key == kLabelHostname && value != hostname) bad = "is '" + value + "', not the node's host name";
    if (!bad.empty()) return InvalidArgument("node registration: label '" + key + "' " + bad);
  }
  return Status::Ok();
}

StatusOr<LabelSelectorTerms> ParseLabelSelector(const std::map<std::string, std::string>& selector) {
  auto normalized = tpu::NormalizeSelectorKeys(selector);
  if (!normalized.ok()) return normalized.status();
  LabelSelectorTerms terms;
  std::map<std::string, std::string> aliased;
  for (const auto& [k, v] : *normalized) {
    // Every ray.io/ key is an alias of the torus.io/ key of the same name.
    std::string key = k.rfind("ray.io/", 0) == 0 ? "torus.io/" + k.substr(7) : k;
    auto [it, fresh] = aliased.emplace(key, v);
    if (!fresh && it->second != v) {
      return InvalidArgument("label selector gives '" + key + "' twice with different values ('" +
                             it->second + "' and '" + v + "')");
    }
  }
  for (const auto& [key, raw] : aliased) {
    if (key.empty()) return InvalidArgument("label selector has an empty key");
    std::string expr = Trim(raw);
    LabelCondition c;
    c.key = key;
    bool neg = !expr.empty() && expr[0] == '!';
    std::string body = neg ? Trim(expr.substr(1)) : expr;
    if (body == "exists()") {
      c.op = neg ? LabelCondition::Op::kNotExists : LabelCondition::Op::kExists;
    } else if (body.rfind("in(", 0) == 0) {
      if (body.back() != ')') {
        return InvalidArgument("label selector '" + key + "': '" + raw + "' lacks a closing ')'");
      }
      auto values = SplitList(key, body.substr(3, body.size() - 4));
      if (!values.ok()) return values.status();
      c.op = neg ? LabelCondition::Op::kNotIn : LabelCondition::Op::kIn;
      c.values = *values;
    } else {
      if (body.empty()) return InvalidArgument("label selector '" + key + "' has an empty value");
      if (body.find_first_of("(),") != std::string::npos) {
        return InvalidArgument("label selector '" + key + "': cannot parse '" + raw +
                               "' (expected v, !v, in(a,b), !in(a,b), exists(), !exists())");
      }
      c.op = neg ? LabelCondition::Op::kNe : LabelCondition::Op::kEq;
      c.values = {body};
    }
    terms.push_back(std::move(c));
  }
  return terms;
}

}  // namespace torus
