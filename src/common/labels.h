// Label selectors in Ray's syntax, matched against node labels. A selector maps a key to an
// expression: "v" (equals), "!v" (differs or absent), "in(a,b)", "!in(a,b)", "exists()",
// "!exists()". Keys under ray.io/ for the TPU identity labels are read as torus.io/ (docs/tpu.md
// section 4). Pure functions, thread-safe.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace torus {

struct LabelCondition {
  enum class Op { kEq, kNe, kIn, kNotIn, kExists, kNotExists };
  std::string key;
  Op op = Op::kEq;
  std::vector<std::string> values;
};
using LabelSelectorTerms = std::vector<LabelCondition>;

// Node labels only Torus sets: node identity (torus.io/node-id, torus.io/hostname), the launcher's
// group (torus.io/node-group, from `torus node --node-group`) and the TPU identity the node detects
// itself (the five torus.io/ TPU keys, spec in docs/tpu.md). Users may set none of these, nor any
// other torus.io/ key, nor the ray.io/ spellings of the TPU keys.
inline constexpr std::string_view kLabelNodeId = "torus.io/node-id";
inline constexpr std::string_view kLabelHostname = "torus.io/hostname";
inline constexpr std::string_view kLabelNodeGroup = "torus.io/node-group";

// True for every key a user may not set on a node: any torus.io/ key and the ray.io/ aliases of
// the TPU identity keys.
bool IsReservedLabelKey(std::string_view key);

// User-given node labels (`torus start --labels`, a manifest's group labels): InvalidArgument
// naming `where` and the first reserved key.
Status ValidateUserLabels(const std::map<std::string, std::string>& labels, std::string_view where);

// The labels of a node registration (head side): the torus.io/ keys must be ones the node sets
// itself, with torus.io/node-id equal to `node_id` and torus.io/hostname to `hostname`; no ray.io/
// TPU alias. InvalidArgument names the key.
Status ValidateRegisteredLabels(const std::map<std::string, std::string>& labels,
                                std::string_view node_id, std::string_view hostname);

// Parses and normalises a selector; InvalidArgument names the bad key or expression.
StatusOr<LabelSelectorTerms> ParseLabelSelector(const std::map<std::string, std::string>& selector);

template <typename LabelMap>
bool MatchesLabels(const LabelSelectorTerms& terms, const LabelMap& labels) {
  for (const auto& t : terms) {
    auto it = labels.find(t.key);
    bool present = it != labels.end();
    switch (t.op) {
      case LabelCondition::Op::kEq:
        if (!present || it->second != t.values[0]) return false;
        break;
      case LabelCondition::Op::kNe:
        if (present && it->second == t.values[0]) return false;
        break;
      case LabelCondition::Op::kIn: {
        if (!present) return false;
        bool any = false;
        for (const auto& v : t.values) any = any || it->second == v;
        if (!any) return false;
        break;
      }
      case LabelCondition::Op::kNotIn:
        if (present) {
          for (const auto& v : t.values) {
            if (it->second == v) return false;
          }
        }
        break;
      case LabelCondition::Op::kExists:
        if (!present) return false;
        break;
      case LabelCondition::Op::kNotExists:
        if (present) return false;
        break;
    }
  }
  return true;
}

}  // namespace torus
