// The seam between the header-only Ray-compatible API (templates in include/torus/api/) and the
// core library (src/core). Everything here is non-template and implemented in libtorus.
//
// Threading: every method may be called from any thread of a driver or worker process once
// Init() has run. Methods that fail for a reason the user API promises (a task error, a dead
// actor, a timeout) throw the ray-compatible exceptions of <torus/api/exceptions.h>; other
// failures throw torus::internal::RayException with a message naming what was wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torus::internal {

// Read-only bytes of one stored value (a msgpack document). Either owned memory or a read-only
// mapping of a shared-memory segment, kept alive as long as this object lives.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual const char* data() const = 0;
  virtual size_t size() const = 0;
};

// One argument of a task or actor call.
struct TaskArg {
  bool is_ref = false;  // true: resolve the object `ref_id` and pass its value
  std::string value;    // msgpack bytes of the argument when !is_ref
  std::string ref_id;   // full object id (see ObjectRef::ID) when is_ref
  std::vector<std::string> nested_ids;  // refs packed inside `value` (kept alive for the task)
};

// A label selector term, Ray syntax: value is "v", "!v", "in(a,b)", "!in(a,b)", "exists()"...
using LabelSelector = std::unordered_map<std::string, std::string>;

// The language of a task's code: Cpp names a RAY_REMOTE registration; Python a function or
// class a Python driver exported (docs/python.md), run by a Python worker.
enum class Language { kCpp = 0, kPython = 1 };

struct TaskOptions {
  Language language = Language::kCpp;
  std::string name;                                   // for listings and logs only
  std::unordered_map<std::string, double> resources;  // empty: {CPU: 1} for tasks
  int max_retries = 3;                                // retries after a worker death
  // Python tasks: also retry (within max_retries) when the task raised (its value is an
  // exception value, docs/python.md "Values").
  bool retry_exceptions = false;
  // Objects the task returns (Python's num_returns); Submit*Task returns the first id, and the
  // others follow from it (core::ReturnIdOf). C++ functions return one.
  int num_returns = 1;
  std::string placement_group_id;                     // empty: none
  int bundle_index = -1;
  bool capture_child_tasks = false;  // with a group: the task's own untargeted work goes there too
  LabelSelector label_selector;
  std::string serialized_runtime_env;  // RuntimeEnv::Serialize(); empty: the parent's (job's)
  // Scheduling strategy SPREAD: each lease goes to the least loaded node that can run the task
  // now (this one on a tie), and the tasks are not pipelined onto a worker.
  bool spread = false;
};

struct ActorOptions {
  Language language = Language::kCpp;
  std::string name;  // empty: anonymous
  std::string ray_namespace;
  std::unordered_map<std::string, double> resources;  // empty: {CPU: 1} to place, 0 while alive
  int max_restarts = 0;  // -1: infinite
  int max_concurrency = 1;
  bool detached = false;
  bool lifetime_set = false;  // false: `detached` is ignored, the job's default lifetime applies
  std::string placement_group_id;
  int bundle_index = -1;
  bool capture_child_tasks = false;  // with a group: the actor's untargeted work goes there too
  LabelSelector label_selector;
  bool spread = false;  // scheduling strategy SPREAD: round robin over the nodes that fit it
  std::string serialized_runtime_env;  // RuntimeEnv::Serialize(); empty: the parent's (job's)
};

// A placement group as the runtime sees it (the API wraps it in torus::PlacementGroup).
struct PlacementGroupSpec {
  std::string name;
  std::string ray_namespace;
  std::vector<std::unordered_map<std::string, double>> bundles;
  std::string strategy;  // PACK, SPREAD, STRICT_PACK, STRICT_SPREAD
  std::vector<LabelSelector> bundle_selectors;  // empty, or one per bundle
  bool detached = false;
  // TPU slice reservation (num_slices > 0): whole slices chosen by the head.
  std::string slice_topology;
  std::string slice_version;
  int num_slices = 0;
  int chips_per_vm = 0;
  int64_t slice_timeout_ms = -1;
};
struct PlacementGroupInfo {
  bool found = false;
  std::string id;
  std::string state;  // PENDING, CREATED, REMOVED, RESCHEDULING
  PlacementGroupSpec spec;
  std::vector<std::string> bundle_nodes;  // node id per bundle ("" while not placed)
  std::vector<std::string> slice_names;   // slice reservations: granted slice per index
  int epoch = 0;
  std::string pending_reason;             // why it is pending, or why it was removed
};

struct SliceQueryResult {
  int intact = 0;
  int ready = 0;
  std::vector<std::string> node_ids;
};

// Runs a registered remote function: each element of `args` is one argument's msgpack bytes.
// Returns the msgpack bytes of the result (nil for void). User exceptions propagate.
struct ArgView {
  const char* data;
  size_t size;
};
using FunctionInvoker = std::function<std::string(const std::vector<ArgView>& args)>;
// Runs a registered actor factory: returns a new instance and how to delete it.
struct ActorInstance {
  void* ptr = nullptr;
  void (*deleter)(void*) = nullptr;
};
using FactoryInvoker = std::function<ActorInstance(const std::vector<ArgView>& args)>;
// Runs a registered member function on `self` (the ActorInstance::ptr).
using MethodInvoker = std::function<std::string(void* self, const std::vector<ArgView>& args)>;

// Process-wide registry of remote functions, filled by RAY_REMOTE at static-initialisation time
// (before main) in drivers and workers alike. Thread-safe.
class FunctionRegistry {
 public:
  static FunctionRegistry& Instance();
  // `key` identifies the C++ entity in this process (function pointer bits or member-pointer
  // bytes); `name` is the portable name used on the wire (the spelling given to RAY_REMOTE).
  void RegisterFunction(std::string key, std::string name, FunctionInvoker invoker);
  void RegisterFactory(std::string key, std::string name, FactoryInvoker invoker);
  void RegisterMethod(std::string key, std::string name, MethodInvoker invoker);
  // Name for a key; throws RayFunctionNotFound naming the function when it was never registered.
  const std::string& NameOf(const std::string& key) const;
  // Lookups by wire name; nullptr when absent.
  const FunctionInvoker* FindFunction(const std::string& name) const;
  const FactoryInvoker* FindFactory(const std::string& name) const;
  const MethodInvoker* FindMethod(const std::string& name) const;

 private:
  FunctionRegistry() = default;
  struct Impl;
  Impl& impl() const;
};

// The core library inside a driver or worker.
class Runtime {
 public:
  virtual ~Runtime() = default;

  // Stores a value owned by this process; returns its object id with one local reference
  // already counted for the caller (the caller's ObjectRef adopts it, see ObjectRef).
  virtual std::string Put(std::string msgpack_bytes) = 0;
  // Same, for a value of exactly `size` bytes that `fill` writes into the destination the runtime
  // chose (for large values: straight into shared memory, one copy in all).
  // `may_hold_refs` false: the value certainly packs no ObjectRef (no need to look for any).
  virtual std::string PutWith(size_t size, const std::function<void(char* dst)>& fill,
                              bool may_hold_refs = true) = 0;
  // Blocks until every object is available or timeout_ms passes (-1: forever). Throws
  // RayTimeoutException on timeout, RayTaskException / RayActorException / RayWorkerException
  // when the object holds an error.
  virtual std::vector<std::shared_ptr<Buffer>> Get(const std::vector<std::string>& ids,
                                                   int timeout_ms) = 0;
  // result[i] is true when ids[i] is ready (value or error). Returns once num_objects are
  // ready or timeout_ms passes (-1: forever).
  virtual std::vector<bool> Wait(const std::vector<std::string>& ids, int num_objects,
                                 int timeout_ms) = 0;

  // Each returns the id of the result object, with one local reference counted for the caller.
  virtual std::string SubmitTask(const std::string& function_name, std::vector<TaskArg> args,
                                 const TaskOptions& options) = 0;
  virtual std::string CreateActor(const std::string& factory_name, std::vector<TaskArg> args,
                                  const ActorOptions& options) = 0;  // returns the actor id
  virtual std::string SubmitActorTask(const std::string& actor_id, const std::string& method_name,
                                      std::vector<TaskArg> args, const TaskOptions& options) = 0;
  // Cancels the task whose result `object_id` is (torus::Cancel). False when unknown here.
  virtual bool Cancel(const std::string& object_id, bool force, bool recursive) = 0;

  // Reference counting of ObjectRefs held by user code in this process.
  virtual void AddLocalReference(const std::string& id) = 0;
  virtual void RemoveLocalReference(const std::string& id) = 0;

  // Actors.
  // Empty string when no live actor has that name in the namespace ("" = current namespace).
  virtual std::string GetNamedActor(const std::string& name, const std::string& ray_namespace) = 0;
  virtual void KillActor(const std::string& actor_id, bool no_restart) = 0;
  virtual void ExitActor() = 0;  // only inside an actor; never returns
  virtual bool WasCurrentActorRestarted() = 0;
  virtual std::string GetNamespace() = 0;

  // Placement groups. Create returns the id at once (the group is PENDING until placed).
  virtual std::string CreatePlacementGroup(const PlacementGroupSpec& spec) = 0;
  virtual void RemovePlacementGroup(const std::string& id) = 0;
  // True once CREATED within timeout_seconds; false on timeout; throws if removed.
  virtual bool WaitPlacementGroup(const std::string& id, int timeout_seconds) = 0;
  // By id, or by name (in the current namespace) when id is empty.
  virtual PlacementGroupInfo GetPlacementGroupInfo(const std::string& id,
                                                   const std::string& name) = 0;
  virtual std::vector<PlacementGroupInfo> GetAllPlacementGroups() = 0;
  // TPU slice counts for a shape (topology/version may be empty) and the nodes of a slice.
  virtual SliceQueryResult QuerySlices(const std::string& topology, const std::string& version,
                                       int chips_per_vm, const std::string& slice_name) = 0;
  // Get of one object (ObjectRef::Get): Get's contract; a runtime may answer a value that is
  // already here without building the vectors. (Last, so that earlier vtable slots keep their
  // place.)
  virtual std::shared_ptr<Buffer> GetOne(const std::string& id, int timeout_ms) {
    std::vector<std::shared_ptr<Buffer>> buffers = Get({id}, timeout_ms);
    return buffers.size() == 1 ? std::move(buffers[0]) : nullptr;
  }
};

// The runtime of this process, or nullptr before Init / after Shutdown.
Runtime* GetRuntime();
// Same, but throws RayException("ray::Init() has not been called") when absent.
Runtime& RequireRuntime();

}  // namespace torus::internal
