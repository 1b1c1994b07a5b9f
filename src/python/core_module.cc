// torus._core: the Python binding of the core worker (docs/python.md, "The _core interface").
// A thin layer: it converts Python values to the runtime's types and back, releases the GIL
// around every call that may block, and maps the runtime's exceptions to Python ones. Pickling,
// the value layout and the Ray API live in the Python package (python/torus).
//
// THREADS: any Python thread may call in; the core worker is thread-safe. The GIL is released
// while the runtime works, so other Python threads run meanwhile.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/core_worker.h"
#include "core/process_runtime.h"
#include "core/reference_counter.h"
#include "python/binding_util.h"
#include "python/py_executor.h"
#include "python/value.h"
#include "python/value_parts.h"
#include "torus/api/exceptions.h"
#include "torus/api/serializer.h"

namespace nb = nanobind;

namespace torus::python {
namespace {

// The interpreter's main thread (threading.main_thread()), set when the module is imported.
unsigned long g_main_thread_ident = 0;
unsigned long MainThreadIdent() { return g_main_thread_ident; }

// ---------------------------------------------------------------------------- lifecycle

void Init(const std::string& address, const std::string& ray_namespace,
          const std::map<std::string, std::string>& job_env_vars,
          const std::vector<std::string>& worker_command, const std::string& logs_dir,
          const std::vector<std::string>& head_args, bool default_detached,
          const std::vector<std::string>& code_search_path) {
  core::DriverOptions o;
  o.address = address;
  o.join_running = true;  // ray.init(): a running cluster on this machine before a private one
  o.ray_namespace = ray_namespace;
  o.job_env_vars = job_env_vars;
  o.python_worker_command = worker_command;
  o.logs_dir = logs_dir;
  o.head_args = head_args;
  o.default_detached = default_detached;
  o.code_search_path = code_search_path;  // C++ workers for cross-language calls
  nb::gil_scoped_release unlocked;
  core::InitDriver(o);
}

void Shutdown() {
  nb::gil_scoped_release unlocked;
  core::ShutdownDriver();
}

[[noreturn]] void RunWorker(nb::object execute, nb::object cancel_async) {
  // The executor is created on the core worker's thread before any task runs; it keeps its own
  // references to `execute` and `cancel_async`.
  PyObject* fn = execute.release().ptr();
  PyObject* cancel = cancel_async.release().ptr();
  nb::gil_scoped_release unlocked;
  core::RunWorker([fn, cancel]() -> std::unique_ptr<core::Executor> {
    nb::gil_scoped_acquire gil;
    return std::make_unique<PyExecutor>(nb::borrow(fn), nb::borrow(cancel));
  });
}

nb::dict Context() {
  core::CoreWorker& w = Require();
  nb::dict d;
  d["job_id"] = w.JobId();
  d["node_id"] = w.node_id();
  d["worker_id"] = w.worker_id();
  d["namespace"] = w.GetNamespace();
  d["head_address"] = w.head_address();
  d["node_address"] = w.node_address();
  d["address"] = w.address();
  d["session_dir"] = w.session_dir();
  d["is_driver"] = w.is_driver();
  d["actor_id"] = w.CurrentActorId();
  d["was_restarted"] = w.is_driver() ? false : w.WasCurrentActorRestarted();
  // The running task (workers, on the thread running it) and the resources granted to it: a
  // task's own, or in an actor its creation's (held while the actor lives).
  const rpc::TaskSpec* task = CurrentTaskSpec();
  const rpc::TaskSpec* creation = ActorCreationSpec();
  d["task_id"] = task ? task->task_id() : std::string();
  d["task_name"] = task ? task->name() : std::string();
  const rpc::TaskSpec* holder = creation ? creation : task;
  nb::dict assigned;
  if (holder) {
    for (const auto& [k, v] : FromProto(holder->resources())) assigned[k.c_str()] = v.ToDouble();
  }
  d["assigned_resources"] = assigned;
  d["placement_group_id"] = holder ? holder->placement_group_id() : std::string();
  d["actor_name"] = creation ? creation->name() : std::string();
  return d;
}

// ---------------------------------------------------------------------------- objects

std::string Put(size_t size, nb::list parts, const std::vector<std::string>& nested) {
  core::CoreWorker& w = Require();
  std::unique_ptr<ValueParts> value = ValueParts::From(size, parts);  // released with the GIL
  nb::gil_scoped_release unlocked;
  return w.PutWith(
      size,
      [&](char* dst) {
        if (internal::RefCollector* c = internal::ActiveRefCollector()) {
          for (const auto& id : nested) c->ids.push_back(id);
        }
        value->WriteTo(dst);
      },
      /*may_hold_refs=*/!nested.empty());
}

// A driver's get/wait waits in slices of this length, and between them runs Python's signal
// handlers: Ctrl-C (KeyboardInterrupt) ends the wait at once, as in Ray, not when the value
// comes. Only drivers (a slice costs a worker a blocked/unblocked report to its node, and
// workers are stopped by cancel) and only on the main thread (the one Python delivers signals
// to).
constexpr int kSignalSliceMs = 200;

bool WaitsForSignals(const core::CoreWorker& w, int timeout_ms) {
  return (timeout_ms < 0 || timeout_ms > kSignalSliceMs) && w.is_driver() &&
         PyThread_get_thread_ident() == MainThreadIdent();
}

// The next slice of a wait that ends at `deadline` (max: never); *last when it is the final one.
int NextSlice(std::chrono::steady_clock::time_point deadline, bool* last) {
  *last = false;
  if (deadline == std::chrono::steady_clock::time_point::max()) return kSignalSliceMs;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - std::chrono::steady_clock::now()).count();
  if (left > kSignalSliceMs) return kSignalSliceMs;
  *last = true;
  return static_cast<int>(std::max<int64_t>(left, 0));
}

std::chrono::steady_clock::time_point DeadlineOf(int timeout_ms) {
  return timeout_ms < 0 ? std::chrono::steady_clock::time_point::max()
                        : std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
}

nb::list Get(const std::vector<std::string>& ids, int timeout_ms) {
  core::CoreWorker& w = Require();
  std::vector<std::shared_ptr<internal::Buffer>> bufs;
  if (!WaitsForSignals(w, timeout_ms)) {
    nb::gil_scoped_release unlocked;
    bufs = w.Get(ids, timeout_ms);
  } else {
    const auto deadline = DeadlineOf(timeout_ms);
    while (true) {
      bool last = false;
      int slice = NextSlice(deadline, &last);
      // Looked up per slice: a signal handler (or another thread) may have shut the runtime down.
      core::CoreWorker& now = Require();
      try {
        nb::gil_scoped_release unlocked;
        bufs = now.Get(ids, slice);
        break;
      } catch (const internal::RayTimeoutException&) {
        if (last) {
          throw internal::RayTimeoutException("Get timed out: some object(s) not ready after " +
                                              std::to_string(timeout_ms) + " ms");
        }
      }
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
    }
  }
  nb::list out;
  for (auto& b : bufs) out.append(nb::cast(Value{std::move(b)}));
  return out;
}

std::vector<bool> Wait(const std::vector<std::string>& ids, int num_returns, int timeout_ms) {
  core::CoreWorker& w = Require();
  if (!WaitsForSignals(w, timeout_ms)) {
    nb::gil_scoped_release unlocked;
    return w.Wait(ids, num_returns, timeout_ms);
  }
  const auto deadline = DeadlineOf(timeout_ms);
  while (true) {
    bool last = false;
    int slice = NextSlice(deadline, &last);
    core::CoreWorker& now = Require();  // per slice, as in Get
    std::vector<bool> ready;
    {
      nb::gil_scoped_release unlocked;
      ready = now.Wait(ids, num_returns, slice);
    }
    // A shutting-down runtime answers at once with what is ready: that is the answer.
    if (last || now.shutting_down() ||
        std::count(ready.begin(), ready.end(), true) >= num_returns) {
      return ready;
    }
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
}

void AddRef(const std::string& id) {
  if (auto* rt = internal::GetRuntime()) rt->AddLocalReference(id);
}

void RemoveRef(const std::string& id) {
  // Called from ObjectRef.__del__, also while the interpreter shuts down: never raise.
  internal::Runtime* rt = internal::GetRuntime();
  if (!rt) return;
  try {
    rt->RemoveLocalReference(id);
  } catch (const std::exception&) {
  }
}

// ---------------------------------------------------------------------------- tasks, actors

std::string SubmitTask(const std::string& function, nb::list args, nb::dict options) {
  core::CoreWorker& w = Require();
  auto a = ToArgs(args);
  auto o = ToTaskOptions(options);
  nb::gil_scoped_release unlocked;
  return w.SubmitTask(function, std::move(a), o);
}

std::string CreateActor(const std::string& cls, nb::list args, nb::dict options) {
  core::CoreWorker& w = Require();
  auto a = ToArgs(args);
  auto o = ToActorOptions(options);
  nb::gil_scoped_release unlocked;
  return w.CreateActor(cls, std::move(a), o);
}

std::string SubmitActorTask(const std::string& actor_id, const std::string& method, nb::list args,
                            nb::dict options) {
  core::CoreWorker& w = Require();
  auto a = ToArgs(args);
  auto o = ToTaskOptions(options);
  nb::gil_scoped_release unlocked;
  return w.SubmitActorTask(actor_id, method, std::move(a), o);
}

// The same with options parsed once (TaskOptions): a handle's option-less calls of one method.
std::string SubmitActorTaskParsed(const std::string& actor_id, const std::string& method,
                                  nb::list args, const internal::TaskOptions& options) {
  core::CoreWorker& w = Require();
  auto a = ToArgs(args);
  nb::gil_scoped_release unlocked;
  return w.SubmitActorTask(actor_id, method, std::move(a), options);
}

}  // namespace
}  // namespace torus::python

NB_MODULE(_core, m) {
  using namespace torus::python;
  g_main_thread_ident =
      nb::cast<unsigned long>(nb::module_::import_("threading").attr("main_thread")().attr("ident"));
  m.doc() = "The core worker of Torus for Python (docs/python.md).";
  // Values still viewed at interpreter exit (a module-level numpy array or Arrow table over an
  // object's shared memory) are not collected by CPython; nanobind would report each as leaked.
  nb::set_leak_warnings(false);
  BindValue(m);
  BindExceptions(m);
  m.def("init", &Init, nb::arg("address"), nb::arg("namespace"), nb::arg("job_env_vars"),
        nb::arg("worker_command"), nb::arg("logs_dir") = "",
        nb::arg("head_args") = std::vector<std::string>{}, nb::arg("default_detached") = false,
        nb::arg("code_search_path") = std::vector<std::string>{});
  m.def("shutdown", &Shutdown);
  m.def("is_initialized", [] { return torus::internal::GetRuntime() != nullptr; });
  m.def("run_worker", &RunWorker, nb::arg("execute"), nb::arg("cancel_async") = nb::none());
  m.def("context", &Context);
  // The placement group that work submitted here without a strategy of its own goes into: the
  // running task's (or this actor's) group when it was scheduled with capture_child_tasks.
  m.def("capture_group", []() -> std::string {
    const torus::rpc::TaskSpec* creation = ActorCreationSpec();
    const torus::rpc::TaskSpec* holder = creation ? creation : CurrentTaskSpec();
    return holder && holder->capture_child_tasks() ? holder->placement_group_id() : std::string();
  });
  m.def("put", &Put, nb::arg("size"), nb::arg("parts"), nb::arg("nested_ids"));
  m.def("get", &Get, nb::arg("ids"), nb::arg("timeout_ms"));
  m.def("wait", &Wait, nb::arg("ids"), nb::arg("num_returns"), nb::arg("timeout_ms"));
  m.def("add_ref", &AddRef);
  m.def("remove_ref", &RemoveRef);
  m.def("submit_task", &SubmitTask);
  // The ids of a task's num_returns objects, from the first (what submit_* returned).
  m.def("return_ids", [](const std::string& first, int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) ids.push_back(torus::core::ReturnIdOf(first, i));
    return ids;
  }, nb::arg("first"), nb::arg("num_returns"));
  m.def("cancel", [](const std::string& id, bool force, bool recursive) {
    torus::core::CoreWorker& w = Require();
    nb::gil_scoped_release unlocked;
    return w.Cancel(id, force, recursive);
  }, nb::arg("object_id"), nb::arg("force") = false, nb::arg("recursive") = false);
  m.def("create_actor", &CreateActor);
  // Options as submit_task/submit_actor_task take them, checked and parsed once: calls that
  // repeat the same options pass this instead of the dict (parsing it costs microseconds).
  nb::class_<torus::internal::TaskOptions>(m, "TaskOptions")
      .def("__init__", [](torus::internal::TaskOptions* self, nb::dict d) {
        new (self) torus::internal::TaskOptions(torus::python::ToTaskOptions(d));
      }, nb::arg("options"));
  m.def("submit_actor_task", &SubmitActorTaskParsed);
  m.def("submit_actor_task", &SubmitActorTask);
  BindCluster(m);
}
