// How values cross process boundaries: msgpack documents produced and read with msgpack-c.
// Task arguments, task results and Put values are each one msgpack document. Any type msgpack-c
// can pack works (user structs via MSGPACK_DEFINE); a void result is msgpack nil.
//
// std::any (alone or in containers) works as in Ray, whose cross-language calls use it: it may
// hold msgpack::type::nil_t, bool, uint64_t, int64_t, double, std::string or std::vector<char>
// (packing any other held type throws RayException naming it); unpacking gives nil_t, bool,
// uint64_t (non-negative integers), int64_t (negative ones), double (any float), std::string
// or std::vector<char> (bin), and throws msgpack::type_error for arrays, maps and ext objects.
//
// ObjectRef and ActorHandle values are packed as msgpack ext objects whose body is the id
// string, with the ext types below. The runtime may scan a stored value or task argument for
// these to learn which objects and actors it references.
#pragma once

#include <any>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <boost/core/demangle.hpp>
#include <msgpack.hpp>

#include "torus/api/exceptions.h"

namespace torus::internal {

inline constexpr int8_t kObjectRefExtType = 0x52;    // 'R': body is an object id
inline constexpr int8_t kActorHandleExtType = 0x41;  // 'A': body is an actor id

// Which objects a value refers to. While a collector is active on a thread, packing an
// ObjectRef records its id there: the runtime keeps those objects alive for as long as the
// packed value needs them (docs/objects.md, "Borrowed references").
struct RefCollector {
  std::vector<std::string> ids;
  // Also take one local reference per id, for the runtime to give back: results are packed
  // from values whose ObjectRefs die before the runtime sees the bytes.
  bool hold = false;
};
// The collector of this thread (nullptr: none). Lives in libtorus, one per thread per process.
RefCollector*& ActiveRefCollector();
// The collector for the result of the task this thread is executing (set by the runtime
// around a task; the invokers make it active while they pack the result).
RefCollector*& ResultRefCollector();

// Makes `c` (or none) the active collector for the scope.
class CollectRefs {
 public:
  explicit CollectRefs(RefCollector* c) : prev_(ActiveRefCollector()) { ActiveRefCollector() = c; }
  ~CollectRefs() { ActiveRefCollector() = prev_; }
  CollectRefs(const CollectRefs&) = delete;
  CollectRefs& operator=(const CollectRefs&) = delete;

 private:
  RefCollector* prev_;
};

// memcpy for large buffers (the body of a big value being packed into shared memory): split
// over the caller and a few helper threads, since one core's copy bandwidth is the limit there.
inline constexpr size_t kParallelCopyMinBytes = size_t{8} << 20;
void CopyLarge(char* dst, const char* src, size_t n);  // in libtorus

// Whether a packed T may contain an ObjectRef: false for types that certainly cannot (numbers,
// strings, containers of those), true otherwise (user types, ObjectRefs). Values of ref-free
// types skip the collector entirely.
template <typename T>
struct MayHoldRefsT : std::true_type {};
template <typename T>
  requires(std::is_arithmetic_v<T> || std::is_enum_v<T>)
struct MayHoldRefsT<T> : std::false_type {};
template <typename C, typename Tr, typename A>
struct MayHoldRefsT<std::basic_string<C, Tr, A>> : std::false_type {};
template <typename C, typename Tr>
struct MayHoldRefsT<std::basic_string_view<C, Tr>> : std::false_type {};
template <>
struct MayHoldRefsT<msgpack::type::nil_t> : std::false_type {};
template <>
struct MayHoldRefsT<std::any> : std::false_type {};  // only the scalar types listed above
template <typename U, typename A>
struct MayHoldRefsT<std::vector<U, A>> : MayHoldRefsT<U> {};
template <typename U, typename A>
struct MayHoldRefsT<std::deque<U, A>> : MayHoldRefsT<U> {};
template <typename U, typename A>
struct MayHoldRefsT<std::list<U, A>> : MayHoldRefsT<U> {};
template <typename U, size_t N>
struct MayHoldRefsT<std::array<U, N>> : MayHoldRefsT<U> {};
template <typename U>
struct MayHoldRefsT<std::optional<U>> : MayHoldRefsT<U> {};
template <typename U, typename Cmp, typename A>
struct MayHoldRefsT<std::set<U, Cmp, A>> : MayHoldRefsT<U> {};
template <typename U, typename H, typename Eq, typename A>
struct MayHoldRefsT<std::unordered_set<U, H, Eq, A>> : MayHoldRefsT<U> {};
template <typename K, typename V, typename Cmp, typename A>
struct MayHoldRefsT<std::map<K, V, Cmp, A>>
    : std::bool_constant<MayHoldRefsT<K>::value || MayHoldRefsT<V>::value> {};
template <typename K, typename V, typename H, typename Eq, typename A>
struct MayHoldRefsT<std::unordered_map<K, V, H, Eq, A>>
    : std::bool_constant<MayHoldRefsT<K>::value || MayHoldRefsT<V>::value> {};
template <typename A, typename B>
struct MayHoldRefsT<std::pair<A, B>>
    : std::bool_constant<MayHoldRefsT<A>::value || MayHoldRefsT<B>::value> {};
template <typename... Ts>
struct MayHoldRefsT<std::tuple<Ts...>> : std::bool_constant<(MayHoldRefsT<Ts>::value || ...)> {};
template <typename T>
inline constexpr bool kMayHoldRefs = MayHoldRefsT<std::remove_cvref_t<T>>::value;

// Readable name of T for error messages.
template <typename T>
std::string TypeName() {
  return boost::core::demangle(typeid(T).name());
}

class Serializer {
 public:
  template <typename T>
  static std::string Serialize(const T& value) {
    std::string out;
    StringWriter writer{&out};
    msgpack::pack(writer, value);
    return out;
  }

  static std::string SerializeNil() { return Serialize(msgpack::type::nil_t()); }

  // Size of the msgpack document of `value`, without building it.
  template <typename T>
  static size_t SerializedSize(const T& value) {
    CountingWriter counter;
    msgpack::pack(counter, value);
    return counter.size;
  }
  // Packs `value` into dst, which must hold SerializedSize(value) bytes.
  template <typename T>
  static void SerializeInto(const T& value, char* dst) {
    PointerWriter writer{dst};
    msgpack::pack(writer, value);
  }

  // Converts one msgpack document to T. Throws RayException naming T and the reason when the
  // bytes are not msgpack or hold another type.
  template <typename T>
  static T Deserialize(const char* data, size_t size) {
    try {
      msgpack::object_handle handle = msgpack::unpack(data, size);
      return handle.get().as<T>();
    } catch (const RayException&) {
      throw;
    } catch (const std::exception& e) {
      throw RayException("cannot deserialize a value as " + TypeName<T>() + ": " + e.what());
    }
  }

  // Same, into a new heap object. Large values are converted in place, not on the stack.
  template <typename T>
  static std::shared_ptr<T> DeserializeShared(const char* data, size_t size) {
    try {
      msgpack::object_handle handle = msgpack::unpack(data, size);
      if constexpr (std::is_default_constructible_v<T>) {
        auto value = std::make_shared<T>();
        handle.get().convert(*value);
        return value;
      } else {
        return std::make_shared<T>(handle.get().as<T>());
      }
    } catch (const RayException&) {
      throw;
    } catch (const std::exception& e) {
      throw RayException("cannot deserialize a value as " + TypeName<T>() + ": " + e.what());
    }
  }

 private:
  // msgpack-c packs into anything with write(const char*, size_t).
  struct StringWriter {
    std::string* out;
    void write(const char* data, size_t size) { out->append(data, size); }
  };
  struct CountingWriter {
    size_t size = 0;
    void write(const char*, size_t n) { size += n; }
  };
  struct PointerWriter {
    char* p;
    void write(const char* data, size_t n) {
      if (n >= kParallelCopyMinBytes) {
        CopyLarge(p, data, n);
      } else {
        std::memcpy(p, data, n);
      }
      p += n;
    }
  };
};

// Body of an ext object of `type`, or of a plain string (accepted for hand-built documents).
// Throws msgpack::type_error for anything else, as msgpack-c's own converters do.
inline std::string UnpackIdExt(const msgpack::object& o, int8_t type) {
  if (o.type == msgpack::type::EXT && o.via.ext.type() == type) {
    return std::string(o.via.ext.data(), o.via.ext.size);
  }
  if (o.type == msgpack::type::STR) return std::string(o.via.str.ptr, o.via.str.size);
  throw msgpack::type_error();
}

template <typename Stream>
void PackIdExt(msgpack::packer<Stream>& packer, int8_t type, const std::string& id) {
  packer.pack_ext(id.size(), type);
  packer.pack_ext_body(id.data(), id.size());
}

}  // namespace torus::internal

namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
namespace adaptor {

template <>
struct pack<std::any> {
  template <typename Stream>
  packer<Stream>& operator()(packer<Stream>& o, const std::any& v) const {
    const std::type_info& t = v.type();
    if (t == typeid(type::nil_t)) return o.pack_nil();
    if (t == typeid(bool)) return o.pack(std::any_cast<bool>(v));
    if (t == typeid(uint64_t)) return o.pack(std::any_cast<uint64_t>(v));
    if (t == typeid(int64_t)) return o.pack(std::any_cast<int64_t>(v));
    if (t == typeid(double)) return o.pack(std::any_cast<double>(v));
    if (t == typeid(std::string)) return o.pack(std::any_cast<const std::string&>(v));
    if (t == typeid(std::vector<char>)) return o.pack(std::any_cast<const std::vector<char>&>(v));
    throw torus::internal::RayException(
        "cannot serialize a std::any holding " + boost::core::demangle(t.name()) +
        " (as in Ray: it must hold nil_t, bool, uint64_t, int64_t, double, std::string or "
        "std::vector<char>)");
  }
};

template <>
struct convert<std::any> {
  const msgpack::object& operator()(const msgpack::object& o, std::any& v) const {
    switch (o.type) {
      case type::NIL: v = type::nil_t(); break;
      case type::BOOLEAN: v = o.as<bool>(); break;
      case type::POSITIVE_INTEGER: v = o.as<uint64_t>(); break;
      case type::NEGATIVE_INTEGER: v = o.as<int64_t>(); break;
      case type::FLOAT32:
      case type::FLOAT64: v = o.as<double>(); break;
      case type::STR: v = o.as<std::string>(); break;
      case type::BIN: v = o.as<std::vector<char>>(); break;
      default: throw msgpack::type_error();
    }
    return o;
  }
};

}  // namespace adaptor
}  // MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS)
}  // namespace msgpack
