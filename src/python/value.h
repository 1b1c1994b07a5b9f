// Value: one stored object's bytes as a Python object with the buffer protocol (read-only).
// It holds the runtime's Buffer (owned memory, or a mapping of the node's shared-memory store),
// so a memoryview of it, and every numpy array built over such a view, keeps the bytes alive.
//
// Threading: immutable once built; the Python objects obey the GIL.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>

#include "torus/internal/runtime.h"

namespace torus::python {

struct Value {
  std::shared_ptr<internal::Buffer> buffer;
};

// Registers the Value type in `m`.
void BindValue(nanobind::module_& m);

}  // namespace torus::python
