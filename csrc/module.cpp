// rtanon._core: the per-sample hot loops of rtanon, one binding file per class.
#include <pybind11/pybind11.h>

namespace py = pybind11;

void bind_ring_buffer(py::module_& m);
void bind_f0_tracker(py::module_& m);

PYBIND11_MODULE(_core, m) {
  m.doc() = "rtanon native kernels (private; use the rtanon package API).";
  bind_ring_buffer(m);
  bind_f0_tracker(m);
}
