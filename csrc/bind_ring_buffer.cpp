#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "ring_buffer.hpp"

namespace py = pybind11;
using rtanon::RingBuffer;

namespace {
using FloatArray = py::array_t<float, py::array::c_style>;

float* checked_1d(FloatArray& a, const char* what) {
  if (a.ndim() != 1) throw py::value_error(std::string(what) + " must be a 1-D float32 array");
  return a.mutable_data();
}
}  // namespace

void bind_ring_buffer(py::module_& m) {
  py::class_<RingBuffer>(m, "RingBuffer", R"doc(
Lock-free single-producer single-consumer ring buffer of float32 samples.

One thread writes, one thread reads; nothing allocates after construction, so
both ends may be used from a real-time audio callback. Audio calls release the
GIL and copy straight from/to the NumPy array given (1-D, float32, C order).
)doc")
      .def(py::init<std::size_t>(), py::arg("capacity"),
           "Creates a buffer holding up to ``capacity`` samples (> 0).")
      .def_property_readonly("capacity", &RingBuffer::capacity, "Samples the buffer can hold.")
      .def_property_readonly("readable", &RingBuffer::readable, "Samples waiting to be read.")
      .def_property_readonly("writable", &RingBuffer::writable, "Free space in samples.")
      .def(
          "write",
          [](RingBuffer& rb, FloatArray samples) {
            if (samples.ndim() != 1) throw py::value_error("samples must be a 1-D float32 array");
            const float* src = samples.data();
            const std::size_t n = static_cast<std::size_t>(samples.shape(0));
            py::gil_scoped_release release;
            return rb.write(src, n);
          },
          py::arg("samples").noconvert(),
          "Appends samples (1-D float32); returns how many fitted (the rest is dropped).")
      .def(
          "read_into",
          [](RingBuffer& rb, FloatArray out) {
            float* dst = checked_1d(out, "out");
            const std::size_t n = static_cast<std::size_t>(out.shape(0));
            py::gil_scoped_release release;
            return rb.read(dst, n);
          },
          py::arg("out").noconvert(),
          "Fills ``out`` (1-D float32) from the front; returns how many samples were copied. "
          "The rest of ``out`` is left untouched.")
      .def(
          "read",
          [](RingBuffer& rb, std::size_t n) {
            n = std::min(n, rb.readable());
            FloatArray out(static_cast<py::ssize_t>(n));
            float* dst = out.mutable_data();
            std::size_t got;
            {
              py::gil_scoped_release release;
              got = rb.read(dst, n);
            }
            if (got != n) out.resize({static_cast<py::ssize_t>(got)});
            return out;
          },
          py::arg("n"), "Removes and returns up to ``n`` samples as a new float32 array.")
      .def(
          "discard",
          [](RingBuffer& rb, std::size_t n) {
            py::gil_scoped_release release;
            return rb.discard(n);
          },
          py::arg("n"), "Drops up to ``n`` samples; returns how many were dropped.")
      .def("clear", &RingBuffer::clear, "Empties the buffer; only while neither end is in use.");
}
