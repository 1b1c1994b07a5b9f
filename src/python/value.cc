#include "python/value.h"

namespace nb = nanobind;

namespace torus::python {
namespace {

int GetBuffer(PyObject* self, Py_buffer* view, int flags) {
  Value* v = nb::inst_ptr<Value>(nb::handle(self));
  const char* data = v->buffer ? v->buffer->data() : "";
  size_t size = v->buffer ? v->buffer->size() : 0;
  // Read-only: asking for a writable view fails with BufferError.
  return PyBuffer_FillInfo(view, self, const_cast<char*>(data), static_cast<Py_ssize_t>(size),
                           /*readonly=*/1, flags);
}

PyType_Slot kValueSlots[] = {
    {Py_bf_getbuffer, reinterpret_cast<void*>(GetBuffer)},
    {0, nullptr},
};

}  // namespace

void BindValue(nb::module_& m) {
  nb::class_<Value>(m, "Value", nb::type_slots(kValueSlots),
                    "The bytes of one stored object (read-only buffer protocol).")
      .def("__len__", [](const Value& v) { return v.buffer ? v.buffer->size() : 0; });
}

}  // namespace torus::python
