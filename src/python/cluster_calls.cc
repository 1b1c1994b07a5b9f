// torus._core's calls about the cluster rather than one task: named actors, kill, placement
// groups and TPU slices, the head's KV store, the node listing (docs/python.md).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>

#include "common/resources.h"
#include "common/rpc.h"
#include "common/wall_clock.h"
#include "core/timeline.h"
#include "proto/torus.grpc.pb.h"
#include "python/binding_util.h"
#include "tpu/topology.h"
#include "torus/api/exceptions.h"

namespace nb = nanobind;

namespace torus::python {
namespace {

// A map of strings to numbers or strings (std or protobuf) as a dict.
template <class Map>
nb::dict ToDict(const Map& m) {
  nb::dict d;
  for (const auto& [k, v] : m) d[k.c_str()] = v;
  return d;
}

nb::dict SpecToDict(const internal::PlacementGroupSpec& s) {
  nb::dict d;
  d["name"] = s.name;
  d["ray_namespace"] = s.ray_namespace;
  d["strategy"] = s.strategy;
  d["detached"] = s.detached;
  nb::list bundles;
  for (const auto& b : s.bundles) bundles.append(ToDict(b));
  d["bundles"] = bundles;
  nb::list selectors;
  for (const auto& sel : s.bundle_selectors) selectors.append(ToDict(sel));
  d["bundle_selectors"] = selectors;
  d["slice_topology"] = s.slice_topology;
  d["slice_version"] = s.slice_version;
  d["num_slices"] = s.num_slices;
  d["chips_per_vm"] = s.chips_per_vm;
  d["slice_timeout_ms"] = s.slice_timeout_ms;
  return d;
}

nb::dict PgToDict(const internal::PlacementGroupInfo& info) {
  nb::dict d;
  d["spec"] = SpecToDict(info.spec);
  d["found"] = info.found;
  d["id"] = info.id;
  d["state"] = info.state;
  d["bundle_nodes"] = info.bundle_nodes;
  d["slice_names"] = info.slice_names;
  d["epoch"] = info.epoch;
  d["pending_reason"] = info.pending_reason;
  return d;
}

std::string CreatePlacementGroup(nb::dict spec) {
  internal::PlacementGroupSpec s;
  if (spec.contains("name")) s.name = nb::cast<std::string>(spec["name"]);
  if (spec.contains("namespace")) s.ray_namespace = nb::cast<std::string>(spec["namespace"]);
  if (spec.contains("ray_namespace")) s.ray_namespace = nb::cast<std::string>(spec["ray_namespace"]);
  if (spec.contains("strategy")) s.strategy = nb::cast<std::string>(spec["strategy"]);
  if (spec.contains("detached")) s.detached = nb::cast<bool>(spec["detached"]);
  if (spec.contains("bundles")) {
    for (nb::handle b : nb::cast<nb::list>(spec["bundles"])) {
      std::unordered_map<std::string, double> m;
      for (auto [k, v] : nb::cast<nb::dict>(b)) m[nb::cast<std::string>(k)] = nb::cast<double>(v);
      s.bundles.push_back(std::move(m));
    }
  }
  const char* sel_key = spec.contains("bundle_selectors") ? "bundle_selectors" : "bundle_label_selector";
  if (spec.contains(sel_key) && !spec[sel_key].is_none()) {
    for (nb::handle b : nb::cast<nb::list>(spec[sel_key])) {
      internal::LabelSelector sel;
      for (auto [k, v] : nb::cast<nb::dict>(b)) sel[nb::cast<std::string>(k)] = nb::cast<std::string>(v);
      s.bundle_selectors.push_back(std::move(sel));
    }
  }
  if (spec.contains("slice_topology")) s.slice_topology = nb::cast<std::string>(spec["slice_topology"]);
  if (spec.contains("slice_version")) s.slice_version = nb::cast<std::string>(spec["slice_version"]);
  if (spec.contains("num_slices")) s.num_slices = nb::cast<int>(spec["num_slices"]);
  if (spec.contains("chips_per_vm")) s.chips_per_vm = nb::cast<int>(spec["chips_per_vm"]);
  if (spec.contains("slice_timeout_ms")) s.slice_timeout_ms = nb::cast<int64_t>(spec["slice_timeout_ms"]);
  for (size_t i = 0; i < s.bundles.size(); ++i) {
    auto st = ValidateResourceRequest(ResourceDoubles(s.bundles[i].begin(), s.bundles[i].end()),
                                      "placement group bundle " + std::to_string(i));
    if (!st.ok()) throw nb::value_error(st.message().c_str());
  }
  core::CoreWorker& w = Require();
  nb::gil_scoped_release unlocked;
  return w.CreatePlacementGroup(s);
}

nb::dict SliceShape(const std::string& version, const std::string& topology,
                    std::optional<int> chips_per_vm) {
  auto shape = tpu::ComputeSliceShape(version, topology, chips_per_vm);
  if (!shape.ok()) throw nb::value_error(shape.status().message().c_str());
  nb::dict d;
  d["topology"] = shape->topology;
  d["chips"] = shape->chips;
  d["chips_per_host"] = shape->chips_per_host;
  d["hosts"] = shape->hosts;
  d["pod_type"] = shape->pod_type;
  d["single_host"] = shape->single_host;
  return d;
}

// A KV key or value given as str (UTF-8) or bytes.
std::string Bytes(nb::handle h) {
  if (nb::isinstance<nb::str>(h)) return nb::cast<std::string>(h);
  nb::bytes b = nb::cast<nb::bytes>(h);
  return std::string(b.c_str(), b.size());
}

nb::list Nodes() {
  core::CoreWorker& w = Require();
  rpc::ListReply reply;
  {
    nb::gil_scoped_release unlocked;
    reply = w.head().ListCluster();
  }
  nb::list out;
  for (const auto& n : reply.nodes()) {
    nb::dict d;
    d["node_id"] = n.node_id();
    d["address"] = n.address();
    d["hostname"] = n.hostname();
    d["alive"] = n.alive();
    d["total"] = ToDict(ToDoubles(FromProto(n.total())));
    d["available"] = ToDict(ToDoubles(FromProto(n.available())));
    d["labels"] = ToDict(n.labels());
    d["pid"] = n.pid();
    d["start_time_ms"] = n.start_time_ms();
    out.append(d);
  }
  return out;
}

// The object store of the node at `address` (Node.Info, 3 s at most): bytes in use and capacity
// of its shared memory, what it spilled to disk; None when it does not answer.
std::optional<nb::dict> NodeStore(const std::string& address) {
  core::CoreWorker& w = Require();
  rpc::NodeInfoReply info;
  bool ok = false;
  {
    nb::gil_scoped_release unlocked;
    auto ctx = NewContext(w.token(), 3000);
    ok = rpc::Node::NewStub(GetChannel(address))->Info(ctx.get(), rpc::Empty(), &info).ok();
  }
  if (!ok) return std::nullopt;
  nb::dict d;
  d["used"] = info.shm_bytes();
  d["objects"] = info.shm_objects();
  d["capacity"] = info.arena_capacity();
  d["spilled_bytes"] = info.spilled_bytes();
  d["spilled_objects"] = info.spilled_objects();
  return d;
}

}  // namespace

void BindKv(nb::module_& m);

void BindCluster(nb::module_& m) {
  BindKv(m);
  m.def("default_detached", [] { return Require().DefaultDetached(); });
  m.def("get_named_actor", [](const std::string& name, const std::string& ns) {
    core::CoreWorker& w = Require();
    nb::gil_scoped_release unlocked;
    return w.GetNamedActor(name, ns);
  });
  m.def("kill_actor", [](const std::string& id, bool no_restart) {
    core::CoreWorker& w = Require();
    nb::gil_scoped_release unlocked;
    w.KillActor(id, no_restart);
  });
  m.def("create_placement_group", &CreatePlacementGroup);
  m.def("remove_placement_group", [](const std::string& id) {
    core::CoreWorker& w = Require();
    nb::gil_scoped_release unlocked;
    w.RemovePlacementGroup(id);
  });
  m.def("wait_placement_group", [](const std::string& id, int timeout_s) {
    core::CoreWorker& w = Require();
    nb::gil_scoped_release unlocked;
    return w.WaitPlacementGroup(id, timeout_s);
  });
  m.def("get_placement_group", [](const std::string& id, const std::string& name) {
    core::CoreWorker& w = Require();
    internal::PlacementGroupInfo info;
    {
      nb::gil_scoped_release unlocked;
      info = w.GetPlacementGroupInfo(id, name);
    }
    return PgToDict(info);
  });
  m.def("placement_groups", [] {
    core::CoreWorker& w = Require();
    std::vector<internal::PlacementGroupInfo> all;
    {
      nb::gil_scoped_release unlocked;
      all = w.GetAllPlacementGroups();
    }
    nb::list out;
    for (const auto& i : all) out.append(PgToDict(i));
    return out;
  });
  m.def("query_slices", [](const std::string& topology, const std::string& version, int chips_per_vm,
                           const std::string& slice_name) {
    core::CoreWorker& w = Require();
    internal::SliceQueryResult r;
    {
      nb::gil_scoped_release unlocked;
      r = w.QuerySlices(topology, version, chips_per_vm, slice_name);
    }
    nb::dict d;
    d["intact"] = r.intact;
    d["ready"] = r.ready;
    d["node_ids"] = r.node_ids;
    return d;
  });
  m.def("slice_shape", &SliceShape, nb::arg("version"), nb::arg("topology"),
        nb::arg("chips_per_vm") = nb::none());
  m.def("nodes", &Nodes);
  m.def("node_store", &NodeStore);
  m.def("timeline_json", [] {
    core::CoreWorker& w = Require();
    nb::gil_scoped_release unlocked;
    const rpc::ListReply cluster = w.head().ListCluster();
    return core::TimelineEvents(core::GatherTasks(cluster, w.token()), cluster, WallClockUs()).dump();
  });
}

void BindKv(nb::module_& m) {
  m.def("kv_put", [](const std::string& ns, nb::handle key, nb::handle value, bool overwrite) {
    core::CoreWorker& w = Require();
    std::string k = Bytes(key), v = Bytes(value);
    nb::gil_scoped_release unlocked;
    return w.head().KvPut(ns, k, v, overwrite);
  });
  m.def("kv_get", [](const std::string& ns, nb::handle key) -> nb::object {
    core::CoreWorker& w = Require();
    std::string k = Bytes(key);
    std::optional<std::string> v;
    {
      nb::gil_scoped_release unlocked;
      v = w.head().KvGet(ns, k);
    }
    if (!v) return nb::none();
    return nb::bytes(v->data(), v->size());
  });
  m.def("kv_del", [](const std::string& ns, nb::handle key) {
    core::CoreWorker& w = Require();
    std::string k = Bytes(key);
    nb::gil_scoped_release unlocked;
    return w.head().KvDel(ns, k);
  });
  m.def("kv_keys", [](const std::string& ns, nb::handle prefix) {
    core::CoreWorker& w = Require();
    std::string p = Bytes(prefix);
    std::vector<std::string> keys;
    {
      nb::gil_scoped_release unlocked;
      keys = w.head().KvKeys(ns, p);
    }
    nb::list out;
    for (const auto& k : keys) out.append(nb::bytes(k.data(), k.size()));
    return out;
  });
}

}  // namespace torus::python
