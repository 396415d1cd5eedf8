#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <vector>

#include "f0_tracker.hpp"

namespace py = pybind11;
using rtanon::F0Kernel;

namespace {
template <typename T>
std::vector<T> to_vector(const py::array_t<T, py::array::c_style | py::array::forcecast>& a) {
  return std::vector<T>(a.data(), a.data() + a.size());
}
}  // namespace

void bind_f0_tracker(py::module_& m) {
  py::class_<F0Kernel>(m, "F0Kernel", R"doc(
Streaming YAAPT-style F0 tracker kernel (one stream per object).

Built from the constants of ``rtanon.f0.config.derive(config)``; use
``rtanon.f0.F0Tracker`` rather than this class. Audio calls release the GIL,
read the float32 input in place and write into the float64 output given.
)doc")
      .def(py::init([](py::array_t<std::int64_t, py::array::c_style | py::array::forcecast> iparams,
                       py::array_t<double, py::array::c_style | py::array::forcecast> fparams,
                       py::array_t<double, py::array::c_style | py::array::forcecast> sos,
                       py::array_t<double, py::array::c_style | py::array::forcecast> hann,
                       py::array_t<double, py::array::c_style | py::array::forcecast> kaiser) {
             return new F0Kernel(to_vector(iparams), to_vector(fparams), to_vector(sos), to_vector(hann),
                                 to_vector(kaiser));
           }),
           py::arg("iparams"), py::arg("fparams"), py::arg("sos"), py::arg("hann"), py::arg("kaiser"),
           "Kernel for the derived constants (int64 and float64 parameter vectors, band-pass "
           "second-order sections [n, 6], Hann window, Kaiser window).")
      .def(
          "process_into",
          [](F0Kernel& k, py::array_t<float, py::array::c_style> x, py::array_t<double, py::array::c_style> out) {
            if (x.ndim() != 1 || out.ndim() != 1) throw py::value_error("x and out must be 1-D arrays");
            const std::size_t n = static_cast<std::size_t>(x.shape(0));
            if (n % F0Kernel::kHop != 0)
              throw py::value_error("x must hold a multiple of 160 samples (10 ms at 16 kHz)");
            if (static_cast<std::size_t>(out.shape(0)) < n / F0Kernel::kHop)
              throw py::value_error("out must hold len(x) // 160 values");
            const float* src = x.data();
            double* dst = out.mutable_data();
            py::gil_scoped_release release;
            k.process(src, n, dst);
          },
          py::arg("x").noconvert(), py::arg("out").noconvert(),
          "Feeds ``x`` (1-D float32, 16 kHz, a multiple of 160 samples) and writes into ``out`` "
          "(1-D float64, at least len(x) // 160) the F0 in Hz (0 = unvoiced) of the frame finalized "
          "by each 10 ms hop.")
      .def("reset", &F0Kernel::reset, "Forgets the stream: filters, buffers, running estimates, decoder.");
}
