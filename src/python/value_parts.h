// ValueParts: a serialized Python value still in pieces, `(offset, buffer)` of a value of `size`
// bytes (the layout `torus._private.serialization.serialize` computes), written into its
// destination in one copy per piece: `_core.put` and a task's large return value use it, so a
// numpy array goes from the user's memory straight into the shared-memory store.
//
// THREADS: From() needs the GIL; WriteTo() does not (the buffers are held, so their memory
// stays put); the destructor releases the buffers and needs the GIL.
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace torus::python {

class ValueParts {
 public:
  // Holds each part's buffer (PyBUF_SIMPLE: contiguous bytes). ValueError when a part ends
  // past `size`.
  static std::unique_ptr<ValueParts> From(size_t size, nanobind::handle parts);
  ~ValueParts();
  ValueParts(const ValueParts&) = delete;
  ValueParts& operator=(const ValueParts&) = delete;

  size_t size() const { return size_; }
  // Copies every part to dst + its offset (large parts by CopyLarge's helper threads); the
  // gaps between parts (alignment padding) are left as they are.
  void WriteTo(char* dst) const;

 private:
  struct Part {
    size_t offset = 0;
    Py_buffer view{};
  };
  ValueParts() = default;

  size_t size_ = 0;
  std::vector<Part> parts_;  // each view held (released by the destructor)
};

}  // namespace torus::python
