// Put, Get and Wait: moving values in and out of the object store. All require Init() (they
// throw RayException otherwise) and may be called from any thread.
#pragma once

#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "torus/api/exceptions.h"
#include "torus/api/object_ref.h"
#include "torus/api/serializer.h"
#include "torus/api/wait_result.h"
#include "torus/internal/runtime.h"

namespace torus {

namespace internal {
template <typename T>
std::vector<std::string> IdsOf(const std::vector<ObjectRef<T>>& refs) {
  std::vector<std::string> ids;
  ids.reserve(refs.size());
  for (const ObjectRef<T>& ref : refs) {
    if (ref.ID().empty()) throw RayException("an empty ObjectRef was passed to Get or Wait");
    ids.push_back(ref.ID());
  }
  return ids;
}
}  // namespace internal

// Stores a copy of `obj`, owned by this process, and returns a reference to it.
template <typename T>
ObjectRef<T> Put(const T& obj) {
  // Two passes (size, then pack into place) so a large value is copied once, into shared memory.
  size_t size = internal::Serializer::SerializedSize(obj);
  // The runtime collects the refs inside the value while `fill` packs it (when it may hold any).
  std::string id = internal::RequireRuntime().PutWith(
      size, [&obj](char* dst) { internal::Serializer::SerializeInto(obj, dst); },
      internal::kMayHoldRefs<T>);
  return internal::ObjectRefAccess::Adopt<T>(std::move(id));
}

// Values of the objects `ids`, in order. Blocks until all are available or timeout_ms passes
// (-1: no limit); throws RayTimeoutException then, or the error an object holds.
template <typename T>
std::vector<std::shared_ptr<T>> Get(const std::vector<std::string>& ids, const int& timeout_ms) {
  std::vector<std::shared_ptr<internal::Buffer>> buffers =
      internal::RequireRuntime().Get(ids, timeout_ms);
  if (buffers.size() != ids.size()) {
    throw internal::RayException("runtime returned " + std::to_string(buffers.size()) +
                                 " values for " + std::to_string(ids.size()) + " objects");
  }
  std::vector<std::shared_ptr<T>> values;
  values.reserve(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i] == nullptr) throw internal::RayException("no value for object " + ids[i]);
    try {
      values.push_back(
          internal::Serializer::DeserializeShared<T>(buffers[i]->data(), buffers[i]->size()));
    } catch (const internal::RayException& e) {
      throw internal::RayException("object " + ids[i] + ": " + e.msg_);
    }
  }
  return values;
}

template <typename T>
std::vector<std::shared_ptr<T>> Get(const std::vector<std::string>& ids) {
  return Get<T>(ids, -1);
}

template <typename T>
std::vector<std::shared_ptr<T>> Get(const std::vector<ObjectRef<T>>& objects,
                                    const int& timeout_ms) {
  return Get<T>(internal::IdsOf(objects), timeout_ms);
}

template <typename T>
std::vector<std::shared_ptr<T>> Get(const std::vector<ObjectRef<T>>& objects) {
  return Get<T>(internal::IdsOf(objects), -1);
}

template <typename T>
std::shared_ptr<T> Get(const ObjectRef<T>& object, const int& timeout_ms) {
  return object.Get(timeout_ms);
}

template <typename T>
std::shared_ptr<T> Get(const ObjectRef<T>& object) {
  return object.Get();
}

// For a void task: returns once it finished, throws if it failed.
inline void Get(const ObjectRef<void>& object, const int& timeout_ms) { object.Get(timeout_ms); }
inline void Get(const ObjectRef<void>& object) { object.Get(); }

// Returns once num_objects of `objects` are available (as values or errors) or timeout_ms
// passes (-1: no limit). Never throws for an object's error; Get does.
template <typename T>
WaitResult<T> Wait(const std::vector<ObjectRef<T>>& objects, int num_objects, int timeout_ms) {
  if (num_objects < 0 || static_cast<size_t>(num_objects) > objects.size()) {
    throw internal::RayException("Wait: num_objects is " + std::to_string(num_objects) +
                                 " but " + std::to_string(objects.size()) +
                                 " objects were given");
  }
  std::vector<bool> is_ready =
      internal::RequireRuntime().Wait(internal::IdsOf(objects), num_objects, timeout_ms);
  if (is_ready.size() != objects.size()) {
    throw internal::RayException("runtime answered Wait for " + std::to_string(is_ready.size()) +
                                 " of " + std::to_string(objects.size()) + " objects");
  }
  std::list<ObjectRef<T>> ready;
  std::list<ObjectRef<T>> unready;
  for (size_t i = 0; i < objects.size(); ++i) {
    (is_ready[i] ? ready : unready).push_back(objects[i]);
  }
  return WaitResult<T>(std::move(ready), std::move(unready));
}

}  // namespace torus
