// ObjectRef<T>: a counted reference to a value of type T in the cluster's object store, as
// returned by Put and by task calls.
//
//   ray::ObjectRef<int> ref = ray::Task(Plus).Remote(1, 2);
//   int three = *ref.Get();          // blocks until the task has run
//
// Reference counting: while at least one ObjectRef to an object lives in some process, the
// object is kept. Every ObjectRef that holds an id owns one local reference in its process's
// runtime: copying adds one (Runtime::AddLocalReference), destroying removes one. Moving
// transfers it. Nothing is counted while no runtime exists (before Init, after Shutdown).
//
// ObjectRefs may be sent inside other values (packed as a msgpack ext of kObjectRefExtType);
// unpacking one in another process creates a new counted reference there, and that process
// registers with the object's owner as a borrower, so the object outlives the references of
// the process that sent it (docs/objects.md).
//
// Thread safety: as for std::string: distinct ObjectRefs may be used from distinct threads;
// one ObjectRef must not be modified concurrently.
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <msgpack.hpp>

#include "torus/api/exceptions.h"
#include "torus/api/logging.h"
#include "torus/api/serializer.h"
#include "torus/api/type_traits.h"
#include "torus/internal/runtime.h"

namespace torus {

namespace internal {
struct ObjectRefAccess;

// Reads one object through the runtime; throws what Runtime::Get throws.
inline std::shared_ptr<Buffer> GetOneBuffer(const std::string& id, int timeout_ms) {
  if (id.empty()) throw RayException("Get called on an empty ObjectRef");
  std::shared_ptr<Buffer> buffer = RequireRuntime().GetOne(id, timeout_ms);
  if (buffer == nullptr) throw RayException("runtime returned no value for object " + id);
  return buffer;
}

template <typename T>
std::shared_ptr<T> GetValue(const std::string& id, int timeout_ms) {
  std::shared_ptr<Buffer> buffer = GetOneBuffer(id, timeout_ms);
  try {
    return Serializer::DeserializeShared<T>(buffer->data(), buffer->size());
  } catch (const RayException& e) {
    throw RayException("object " + id + ": " + e.msg_);
  }
}
}  // namespace internal

template <typename T>
class ObjectRef {
 public:
  // An empty reference: ID() is "", Get() throws.
  ObjectRef() = default;

  // A new counted reference to an existing object, e.g. an id received from elsewhere.
  ObjectRef(const std::string& id) : id_(id) { AddReference(); }  // NOLINT: implicit, as Ray

  ObjectRef(const ObjectRef& other) : id_(other.id_) { AddReference(); }
  ObjectRef(ObjectRef&& other) noexcept : id_(std::move(other.id_)) { other.id_.clear(); }
  // Handles copy and move; the new reference is counted before the old one is released, so
  // self-assignment and assigning a reference to the same object are safe.
  ObjectRef& operator=(ObjectRef other) noexcept {
    id_.swap(other.id_);
    return *this;
  }
  ~ObjectRef() { RemoveReference(); }

  // Marks the type for Ray-style trait checks.
  static bool IsObjectRef() { return true; }

  // The object id: opaque, printable; "" for an empty reference.
  const std::string& ID() const { return id_; }

  bool operator==(const ObjectRef& other) const { return id_ == other.id_; }

  // std::shared_ptr<T>, or void for ObjectRef<void>.
  using GetResult = std::conditional_t<std::is_void_v<T>, void, std::shared_ptr<T>>;

  // Blocks until the value is available (or timeout_ms passes, -1: no limit) and returns a
  // copy of it; for ObjectRef<void> returns once the task finished. Throws RayTaskException
  // (the task threw), RayActorException, RayWorkerException, RayTimeoutException, or
  // RayException.
  GetResult Get() const { return Get(-1); }
  GetResult Get(const int& timeout_ms) const {
    if constexpr (std::is_void_v<T>) {
      internal::GetOneBuffer(id_, timeout_ms);
    } else {
      return internal::GetValue<T>(id_, timeout_ms);
    }
  }

 private:
  friend struct internal::ObjectRefAccess;
  struct AdoptTag {};
  // Takes over a reference the runtime already counted for the caller.
  ObjectRef(AdoptTag, std::string id) : id_(std::move(id)) {}

  void AddReference() {
    if (id_.empty()) return;
    if (internal::Runtime* runtime = internal::GetRuntime()) runtime->AddLocalReference(id_);
  }
  void RemoveReference() noexcept {
    if (id_.empty()) return;
    internal::Runtime* runtime = internal::GetRuntime();
    if (runtime == nullptr) return;
    try {
      runtime->RemoveLocalReference(id_);
    } catch (const std::exception& e) {
      // A destructor must not throw; a failed release only delays freeing the object.
      RAYLOG(WARNING) << "releasing object " << id_ << " failed: " << e.what();
    }
  }

  std::string id_;
};

namespace internal {
// The only way to build an ObjectRef that adopts an already-counted reference: used with the
// ids returned by Runtime::Put / SubmitTask / SubmitActorTask.
struct ObjectRefAccess {
  template <typename T>
  static ObjectRef<T> Adopt(std::string id) {
    return ObjectRef<T>(typename ObjectRef<T>::AdoptTag{}, std::move(id));
  }
};
}  // namespace internal

}  // namespace torus

namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
namespace adaptor {

template <typename T>
struct pack<torus::ObjectRef<T>> {
  template <typename Stream>
  packer<Stream>& operator()(packer<Stream>& o, const torus::ObjectRef<T>& ref) const {
    torus::internal::PackIdExt(o, torus::internal::kObjectRefExtType, ref.ID());
    if (torus::internal::RefCollector* c = torus::internal::ActiveRefCollector();
        c != nullptr && !ref.ID().empty()) {
      c->ids.push_back(ref.ID());
      if (c->hold) {
        if (torus::internal::Runtime* runtime = torus::internal::GetRuntime()) {
          runtime->AddLocalReference(ref.ID());
        }
      }
    }
    return o;
  }
};

// Unpacking makes a new counted reference in this process.
template <typename T>
struct convert<torus::ObjectRef<T>> {
  const msgpack::object& operator()(const msgpack::object& o, torus::ObjectRef<T>& ref) const {
    ref = torus::ObjectRef<T>(
        torus::internal::UnpackIdExt(o, torus::internal::kObjectRefExtType));
    return o;
  }
};

}  // namespace adaptor
}  // MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS)
}  // namespace msgpack
