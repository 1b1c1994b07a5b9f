#include "python/py_executor.h"

#include <nanobind/stl/string.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "python/value.h"
#include "python/value_parts.h"
#include "torus/api/exceptions.h"
#include "torus/api/serializer.h"
#include "torus/api/xlang.h"

namespace nb = nanobind;

namespace torus::python {

namespace {
thread_local const rpc::TaskSpec* t_current = nullptr;
std::atomic<const rpc::TaskSpec*> g_creation{nullptr};

struct CurrentTask {
  explicit CurrentTask(const rpc::TaskSpec* s) : prev(t_current) { t_current = s; }
  ~CurrentTask() { t_current = prev; }
  const rpc::TaskSpec* prev;
};

// Tasks running now, by task id: the Python thread running each and whether it is an actor
// call. Registered and erased with the GIL held, as Interrupt holds it while it looks one up
// and sets its exception, so an interrupt never reaches a thread after its task ended.
struct RunningTask {
  unsigned long thread;
  bool actor_call;
  bool interrupted = false;  // an exception was set for the thread
};
std::mutex g_running_mu;
std::unordered_map<std::string, RunningTask>& Running() {
  static auto* m = new std::unordered_map<std::string, RunningTask>();
  return *m;
}

class RunningScope {
 public:
  explicit RunningScope(const rpc::TaskSpec& spec) : id_(spec.task_id()) {
    thread_ = PyThread_get_thread_ident();
    std::lock_guard<std::mutex> lock(g_running_mu);
    Running()[id_] = {thread_, !spec.actor_id().empty()};
  }
  ~RunningScope() {  // GIL held
    bool interrupted = false;
    {
      std::lock_guard<std::mutex> lock(g_running_mu);
      auto it = Running().find(id_);
      interrupted = it->second.interrupted;
      Running().erase(it);
    }
    // An interrupt that came as the task ended must not reach the thread's next task.
    if (interrupted) PyThreadState_SetAsyncExc(thread_, nullptr);
  }

 private:
  std::string id_;
  unsigned long thread_;
};

// This thread's Python thread state, made on its first task and kept while the thread lives.
// gil_scoped_acquire on a thread without one creates a PyThreadState and destroys it again on
// release: per task an mmap/munmap of its frame stack, a gettid, a new threading.local() world
// and a new threading._DummyThread, ~20 us of a ~40 us actor call. The executor's threads (a
// connection's reader, the pool of a threaded actor) are long-lived, so one state each is kept.
// The GIL is not held between tasks.
class KeptThreadState {
 public:
  KeptThreadState() {
    PyGILState_Ensure();             // creates the state, takes the GIL, counter 1
    tstate_ = PyEval_SaveThread();   // gives the GIL back; the state stays (counter 1)
  }
  ~KeptThreadState() {  // the thread ends (a connection closed): free its state
    if (!Py_IsInitialized()) return;
    PyEval_RestoreThread(tstate_);
    PyGILState_Release(PyGILState_UNLOCKED);  // counter 0: clears and deletes the state
  }
  KeptThreadState(const KeptThreadState&) = delete;
  KeptThreadState& operator=(const KeptThreadState&) = delete;

 private:
  PyThreadState* tstate_ = nullptr;
};

void KeepThreadState() { thread_local KeptThreadState kept; }
}  // namespace

const rpc::TaskSpec* CurrentTaskSpec() { return t_current; }
const rpc::TaskSpec* ActorCreationSpec() { return g_creation.load(std::memory_order_acquire); }

// Called by C++ code: its names carry the prefixes of include/torus/api/xlang.h.
bool IsCrossLanguage(const std::string& name) {
  return name.rfind(internal::kXlangFunctionPrefix, 0) == 0 ||
         name.rfind(internal::kXlangMethodPrefix, 0) == 0;
}

PyExecutor::PyExecutor(nb::object execute, nb::object cancel_async)
    : execute_(execute.release().ptr()),
      cancel_async_(cancel_async.is_none() ? nullptr : cancel_async.release().ptr()) {}

bool PyExecutor::Interrupt(const std::string& task_id) {
  nb::gil_scoped_acquire gil;
  RunningTask t;
  {
    std::lock_guard<std::mutex> lock(g_running_mu);
    auto it = Running().find(task_id);
    if (it == Running().end()) return false;
    if (!it->second.actor_call) it->second.interrupted = true;
    t = it->second;
  }
  if (!t.actor_call) {
    // Raised in the task's thread at its next Python instruction, as Ray's SIGINT does.
    return PyThreadState_SetAsyncExc(t.thread, PyExc_KeyboardInterrupt) == 1;
  }
  // An actor call: only an async actor's (the coroutine is cancelled); sync calls run on.
  if (!cancel_async_) return false;
  try {
    return nb::cast<bool>(nb::borrow(cancel_async_)(t.thread));
  } catch (const nb::python_error&) {
    return false;
  }
}

namespace {
// Holds `ids` (packed into a result) until the submitter registered as their borrower: the
// task executor's result collector drops the holds after replying.
void HoldResultRefs(nb::list ids, std::vector<std::string>* out) {
  internal::Runtime* rt = internal::GetRuntime();
  internal::RefCollector* c = internal::ResultRefCollector();
  for (nb::handle h : ids) {
    std::string id = nb::cast<std::string>(h);
    if (c && rt) {
      rt->AddLocalReference(id);
      c->ids.push_back(id);
    }
    if (out) out->push_back(std::move(id));
  }
}

// num_returns > 1: one value and one list of packed refs per return (the executor checked the
// count).
core::TaskOutput PiecesOutput(nb::handle value);

// Each return value as bytes, or a large one in pieces, (size, parts): the first is written
// straight into the store (one copy), the others are gathered into their string (one copy)
// instead of being joined in Python first.
core::TaskOutput MultiReturnOutput(nb::tuple result, int num_returns) {
  nb::list values = nb::cast<nb::list>(result[0]);
  nb::list nested = nb::cast<nb::list>(result[2]);
  if (values.size() != static_cast<size_t>(num_returns) || nested.size() != values.size()) {
    throw internal::RayException("executor returned a malformed multi-return result");
  }
  core::TaskOutput output;
  output.more.reserve(num_returns - 1);
  output.nested.resize(num_returns);
  for (int i = 0; i < num_returns; ++i) {
    nb::handle v = values[i];
    if (nb::isinstance<nb::tuple>(v)) {
      if (i == 0) {
        core::TaskOutput first = PiecesOutput(v);
        output.value_size = first.value_size;
        output.write_value = std::move(first.write_value);
      } else {
        auto pieces = nb::cast<nb::tuple>(v);
        auto parts = ValueParts::From(nb::cast<size_t>(pieces[0]), pieces[1]);
        std::string& out = output.more.emplace_back();
        out.resize(parts->size());
        parts->WriteTo(out.data());
      }
    } else {
      nb::bytes b = nb::cast<nb::bytes>(v);
      (i == 0 ? output.value : output.more.emplace_back()).assign(b.c_str(), b.size());
    }
    HoldResultRefs(nb::cast<nb::list>(nested[i]), &output.nested[i]);
  }
  return output;
}

// A large value in pieces, (size, parts): the task executor writes them straight into the
// store, one copy; the pieces' buffers are let go with the GIL, on whichever thread drops them.
core::TaskOutput PiecesOutput(nb::handle value) {
  auto pieces = nb::cast<nb::tuple>(value);
  std::shared_ptr<ValueParts> parts(
      ValueParts::From(nb::cast<size_t>(pieces[0]), pieces[1]).release(), [](ValueParts* p) {
        KeepThreadState();
        nb::gil_scoped_acquire gil;
        delete p;
      });
  core::TaskOutput output;
  output.value_size = parts->size();
  output.write_value = [parts](char* dst) { parts->WriteTo(dst); };
  return output;
}
}  // namespace

StatusOr<core::TaskOutput> PyExecutor::Invoke(const rpc::TaskSpec& spec,
                                         const std::vector<internal::ArgView>& args,
                                         const std::vector<std::shared_ptr<internal::Buffer>>& owners) {
  KeepThreadState();
  nb::gil_scoped_acquire gil;  // counter 1 -> 2 -> 1: takes and gives back the GIL only
  nb::list py_args;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i < owners.size() && owners[i]) {
      py_args.append(nb::cast(Value{owners[i]}));  // shared memory: a view, no copy
    } else {
      py_args.append(nb::bytes(args[i].data, args[i].size));
    }
  }
  int kind = spec.actor_creation() ? 1 : (spec.actor_id().empty() ? 0 : 2);
  CurrentTask current(&spec);
  std::optional<RunningScope> running;
  if (kind != 1) running.emplace(spec);
  const int num_returns = std::max(spec.num_returns(), 1);
  nb::object out = nb::borrow(execute_)(kind, spec.function(), spec.actor_id(), py_args,
                                        spec.max_concurrency(), num_returns);
  // Python errors inside the executor itself (not user code, which it encodes) propagate as
  // nb::python_error, a std::exception the TaskExecutor reports as the task's failure.
  auto result = nb::cast<nb::tuple>(out);
  // (value bytes, status, nested ids[, the value: it keeps the refs in it alive until they are
  // held below]).
  if (result.size() != 3 && result.size() != 4) {
    throw internal::RayException("executor returned a malformed result");
  }
  int status = nb::cast<int>(result[1]);
  if (num_returns > 1 && kind != 1) {
    core::TaskOutput output = MultiReturnOutput(result, num_returns);
    if (status == 2) throw core::ExitActorSignal{};
    return output;
  }
  HoldResultRefs(nb::cast<nb::list>(result[2]), nullptr);
  if (status == 0 && kind != 1 && nb::isinstance<nb::tuple>(result[0])) {
    return PiecesOutput(result[0]);
  }
  core::TaskOutput output;
  nb::bytes value = nb::cast<nb::bytes>(result[0]);
  std::string bytes(value.c_str(), value.size());
  if (status == 2) throw core::ExitActorSignal{};
  if (status == 1 && IsCrossLanguage(spec.function())) {
    // A C++ caller cannot read a pickled exception: the executor returned its text, which
    // becomes the task's error (RayTaskException in C++).
    throw std::runtime_error(bytes);
  }
  if (kind == 1) {
    if (status == 1) {
      // The constructor raised: the actor is dead; its callers see this text (the formatted
      // exception and traceback the executor returns for a creation) in ActorDiedError.
      throw std::runtime_error(bytes.empty() || bytes[0] == '\xc1'
                                   ? std::string("the actor's constructor raised an exception")
                                   : bytes);
    }
    static rpc::TaskSpec creation;  // one actor per worker process, created once
    creation.CopyFrom(spec);
    creation.clear_args();
    g_creation.store(&creation, std::memory_order_release);
  }
  output.value = std::move(bytes);
  return output;
}

}  // namespace torus::python
