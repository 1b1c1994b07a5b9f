// Label selectors in Ray's syntax, matched against node labels. A selector maps a key to an
// expression: "v" (equals), "!v" (differs or absent), "in(a,b)", "!in(a,b)", "exists()",
// "!exists()". Keys under ray.io/ for the TPU identity labels are read as torus.io/ (spec/tpu.md
// section 4). Pure functions, thread-safe.
#pragma once

#include <map>
#include <string>
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
