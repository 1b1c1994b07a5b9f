// NodeLiveness: what the head's node list says about whether a node is gone, for judging an
// object copy lost (docs/objects.md "Lost objects"). Plain data, built from one Head.List reply
// (CoreWorker::LiveNodes); no lock, no thread of its own.
//
// A node is gone when the head lists it dead, or when the head does not list it alive while it
// can say so: not while it is settling (ListReply.settling: it started or resumed less than a
// node timeout ago, and a live node may not have registered again yet), and not when it could
// not be asked at all.
#pragma once

#include <string>
#include <unordered_set>

namespace torus::core {

struct NodeLiveness {
  std::unordered_set<std::string> alive, dead;
  bool settling = false;  // a node the head does not list may be alive
  bool known = true;      // false: the head could not be asked; no node is judged gone

  bool Gone(const std::string& node_id) const {
    if (dead.count(node_id)) return true;
    return known && !settling && !alive.count(node_id);
  }
};

}  // namespace torus::core
