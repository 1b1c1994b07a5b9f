// ValueParts: see value_parts.h.
#include "python/value_parts.h"

#include <cstring>

#include "torus/api/serializer.h"

namespace nb = nanobind;

namespace torus::python {

std::unique_ptr<ValueParts> ValueParts::From(size_t size, nb::handle parts) {
  std::unique_ptr<ValueParts> v(new ValueParts());
  v->size_ = size;
  for (nb::handle h : parts) {
    auto t = nb::cast<nb::tuple>(h);
    Part p;
    p.offset = nb::cast<size_t>(t[0]);
    if (PyObject_GetBuffer(t[1].ptr(), &p.view, PyBUF_SIMPLE) != 0) throw nb::python_error();
    v->parts_.push_back(p);  // held from here: the destructor releases it
    if (p.offset + static_cast<size_t>(p.view.len) > size) {
      throw nb::value_error("a part of the value ends past the value's size");
    }
  }
  return v;
}

ValueParts::~ValueParts() {
  for (auto& p : parts_) PyBuffer_Release(&p.view);
}

void ValueParts::WriteTo(char* dst) const {
  for (const auto& p : parts_) {
    const char* src = static_cast<const char*>(p.view.buf);
    const size_t n = static_cast<size_t>(p.view.len);
    if (n >= internal::kParallelCopyMinBytes) {
      internal::CopyLarge(dst + p.offset, src, n);
    } else {
      std::memcpy(dst + p.offset, src, n);
    }
  }
}

}  // namespace torus::python
