#include "python/binding_util.h"

#include <nanobind/stl/string.h>

#include "common/resources.h"
#include "core/process_runtime.h"
#include "torus/api/exceptions.h"

namespace nb = nanobind;

namespace torus::python {
namespace {

PyObject* g_error = nullptr;  // torus._core.Error, the base of the others
PyObject* g_task_error = nullptr;
PyObject* g_actor_died = nullptr;
PyObject* g_worker_crashed = nullptr;
PyObject* g_object_lost = nullptr;
PyObject* g_owner_died = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_runtime_env = nullptr;
PyObject* g_slice_lost = nullptr;
PyObject* g_not_found = nullptr;
PyObject* g_cancelled = nullptr;
PyObject* g_invalid = nullptr;

PyObject* NewError(nb::module_& m, const char* name, PyObject* base) {
  std::string full = std::string("torus._core.") + name;
  PyObject* t = PyErr_NewException(full.c_str(), base, nullptr);
  if (!t) throw nb::python_error();
  m.attr(name) = nb::borrow(t);
  return t;
}

void Translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const internal::RayTaskException& e) {
    PyErr_SetString(g_task_error, e.what());
  } catch (const internal::RayActorException& e) {
    PyErr_SetString(g_actor_died, e.what());
  } catch (const internal::RayWorkerException& e) {
    PyErr_SetString(g_worker_crashed, e.what());
  } catch (const internal::OwnerDiedException& e) {
    PyErr_SetString(g_owner_died, e.what());
  } catch (const internal::UnreconstructableException& e) {
    PyErr_SetString(g_object_lost, e.what());
  } catch (const internal::RayTimeoutException& e) {
    PyErr_SetString(g_timeout, e.what());
  } catch (const internal::RayRuntimeEnvException& e) {
    PyErr_SetString(g_runtime_env, e.what());
  } catch (const internal::RaySliceLostException& e) {
    PyErr_SetString(g_slice_lost, e.what());
  } catch (const internal::TaskCancelledException& e) {
    PyErr_SetString(g_cancelled, e.what());
  } catch (const internal::RayInvalidArgumentException& e) {
    PyErr_SetString(g_invalid, e.what());
  } catch (const internal::RayFunctionNotFound& e) {
    PyErr_SetString(g_not_found, e.what());
  } catch (const internal::RayException& e) {
    PyErr_SetString(g_error, e.what());
  }
}

template <class T>
T Opt(nb::dict d, const char* key, T fallback) {
  if (!d.contains(key)) return fallback;
  nb::object v = d[key];
  if (v.is_none()) return fallback;
  return nb::cast<T>(v);
}

std::unordered_map<std::string, double> Resources(nb::dict d) {
  std::unordered_map<std::string, double> out;
  if (!d.contains("resources") || d["resources"].is_none()) return out;
  for (auto [k, v] : nb::cast<nb::dict>(d["resources"])) {
    out[nb::cast<std::string>(k)] = nb::cast<double>(v);
  }
  // The runtime's rule (also the nodes' and the head's): an amount they would refuse is refused
  // here, at the call, rather than failing the work later (torus._private.options checks Ray's
  // rule before this).
  if (auto s = ValidateResources(ResourceDoubles(out.begin(), out.end()), "resources"); !s.ok()) {
    throw nb::value_error(s.message().c_str());
  }
  return out;
}

internal::LabelSelector Selector(nb::dict d) {
  internal::LabelSelector out;
  if (!d.contains("label_selector") || d["label_selector"].is_none()) return out;
  for (auto [k, v] : nb::cast<nb::dict>(d["label_selector"])) {
    out[nb::cast<std::string>(k)] = nb::cast<std::string>(v);
  }
  return out;
}

void CheckKeys(nb::dict d, std::initializer_list<const char*> known, const char* what) {
  for (auto [k, v] : d) {
    std::string key = nb::cast<std::string>(k);
    bool ok = false;
    for (const char* n : known) ok = ok || key == n;
    if (!ok) throw nb::value_error((std::string(what) + ": unknown option '" + key + "'").c_str());
  }
}

}  // namespace

core::CoreWorker& Require() {
  core::CoreWorker* w = core::Current();
  if (!w) throw internal::RayException("torus is not initialized: call torus.init() first");
  return *w;
}

std::vector<internal::TaskArg> ToArgs(nb::list args) {
  std::vector<internal::TaskArg> out;
  out.reserve(args.size());
  for (nb::handle h : args) {
    auto t = nb::cast<nb::tuple>(h);
    internal::TaskArg a;
    a.is_ref = nb::cast<bool>(t[0]);
    if (a.is_ref) {
      a.ref_id = nb::cast<std::string>(t[1]);
    } else {
      nb::bytes b = nb::cast<nb::bytes>(t[1]);
      a.value.assign(b.c_str(), b.size());
      for (nb::handle n : nb::cast<nb::list>(t[2])) a.nested_ids.push_back(nb::cast<std::string>(n));
    }
    out.push_back(std::move(a));
  }
  return out;
}

internal::Language LanguageOf(nb::dict d) {
  std::string lang = Opt<std::string>(d, "language", "PYTHON");
  if (lang == "PYTHON") return internal::Language::kPython;
  if (lang == "CPP") return internal::Language::kCpp;
  throw nb::value_error(("unknown language '" + lang + "' (PYTHON or CPP)").c_str());
}

internal::TaskOptions ToTaskOptions(nb::dict d) {
  CheckKeys(d, {"name", "resources", "max_retries", "retry_exceptions", "placement_group_id",
                "bundle_index", "label_selector", "serialized_runtime_env", "language",
                "num_returns", "capture_child_tasks", "spread"},
            "task options");
  internal::TaskOptions o;
  o.language = LanguageOf(d);
  o.name = Opt<std::string>(d, "name", "");
  o.resources = Resources(d);
  o.max_retries = Opt<int>(d, "max_retries", 3);
  o.retry_exceptions = Opt<bool>(d, "retry_exceptions", false);
  o.num_returns = Opt<int>(d, "num_returns", 1);
  if (o.num_returns < 1) throw nb::value_error("num_returns must be at least 1");
  o.placement_group_id = Opt<std::string>(d, "placement_group_id", "");
  o.bundle_index = Opt<int>(d, "bundle_index", -1);
  o.spread = Opt<bool>(d, "spread", false);
  o.capture_child_tasks = Opt<bool>(d, "capture_child_tasks", false);
  o.label_selector = Selector(d);
  o.serialized_runtime_env = Opt<std::string>(d, "serialized_runtime_env", "");
  return o;
}

internal::ActorOptions ToActorOptions(nb::dict d) {
  CheckKeys(d, {"name", "ray_namespace", "resources", "max_restarts", "max_task_retries",
                "max_concurrency", "detached", "lifetime_set", "placement_group_id",
                "bundle_index", "label_selector", "serialized_runtime_env", "class_name",
                "language", "capture_child_tasks", "spread"},
            "actor options");
  internal::ActorOptions o;
  o.language = LanguageOf(d);
  o.name = Opt<std::string>(d, "name", "");
  o.ray_namespace = Opt<std::string>(d, "ray_namespace", "");
  o.resources = Resources(d);
  o.max_restarts = Opt<int>(d, "max_restarts", 0);
  o.max_concurrency = Opt<int>(d, "max_concurrency", 1);
  o.detached = Opt<bool>(d, "detached", false);
  o.lifetime_set = Opt<bool>(d, "lifetime_set", false);
  o.placement_group_id = Opt<std::string>(d, "placement_group_id", "");
  o.bundle_index = Opt<int>(d, "bundle_index", -1);
  o.spread = Opt<bool>(d, "spread", false);
  o.capture_child_tasks = Opt<bool>(d, "capture_child_tasks", false);
  o.label_selector = Selector(d);
  o.serialized_runtime_env = Opt<std::string>(d, "serialized_runtime_env", "");
  return o;
}

void BindExceptions(nb::module_& m) {
  g_error = NewError(m, "Error", PyExc_RuntimeError);
  g_task_error = NewError(m, "TaskError", g_error);
  g_actor_died = NewError(m, "ActorDiedError", g_error);
  g_worker_crashed = NewError(m, "WorkerCrashedError", g_error);
  g_object_lost = NewError(m, "ObjectLostError", g_error);
  g_owner_died = NewError(m, "OwnerDiedError", g_object_lost);
  g_timeout = NewError(m, "GetTimeoutError", g_error);
  g_runtime_env = NewError(m, "RuntimeEnvError", g_error);
  g_slice_lost = NewError(m, "SliceLostError", g_error);
  g_not_found = NewError(m, "FunctionNotFoundError", g_error);
  g_cancelled = NewError(m, "TaskCancelledError", g_error);
  {
    // Both a _core.Error and a ValueError: what Ray raises for a bad argument.
    nb::object bases = nb::steal(PyTuple_Pack(2, g_error, PyExc_ValueError));
    g_invalid = NewError(m, "InvalidArgument", bases.ptr());
  }
  nb::register_exception_translator(&Translate);
}

}  // namespace torus::python
