// The braid_torch Python module: importing it registers braid as the torch.distributed
// backend "braid" (Backend.register_backend), whose process group is
// braid::torch::ProcessGroup (braid/torch/process_group.hpp).
//
//   import braid_torch
//   torch.distributed.init_process_group("braid", init_method="env://", rank=r, world_size=n)
//
// braid_torch.new_process_group(store, rank, size, timeout) is the function registered:
// what init_process_group and new_group call with the prefix store they made. It releases
// the GIL while it joins, so a Python store's other users (and other threads) go on.
#include <chrono>
#include <pybind11/chrono.h>

#include <torch/csrc/utils/pybind.h>

#include <braid/build_config.hpp>
#include <braid/torch/process_group.hpp>

namespace py = pybind11;

namespace {

// The static type is c10d's Backend, which torch._C registered: pybind11 finds no class for
// braid's own, and Python needs none.
c10::intrusive_ptr<c10d::Backend> new_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  return braid::torch::ProcessGroup::join(store, rank, size, timeout);
}

}  // namespace

PYBIND11_MODULE(braid_torch, module) {
  module.doc() =
      "braid as a torch.distributed backend: import it, then init_process_group(\"braid\")";
  module.attr("__version__") = BRAID_VERSION;
  // Whether the group takes CUDA tensors (built against a libtorch with CUDA).
  module.attr("with_cuda") = BRAID_WITH_TORCH_CUDA != 0;
  // torch.distributed first: it registers c10d's Store and ProcessGroup with pybind11.
  py::object distributed = py::module::import("torch.distributed");
  module.def("new_process_group", &new_process_group, py::arg("store"), py::arg("rank"),
             py::arg("size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
             "Joins the ranks that share `store` into a braid process group (collective).");
  py::object backend = distributed.attr("Backend");
  // A second import of the module (importlib.reload) finds the backend registered.
  if (!py::hasattr(backend, "BRAID")) {
    // The devices braid's group serves (a list: a string was iterated per character).
    py::list devices;
    devices.append("cpu");
    if (BRAID_WITH_TORCH_CUDA != 0) devices.append("cuda");
    backend.attr("register_backend")("braid", module.attr("new_process_group"),
                                     py::arg("extended_api") = false, py::arg("devices") = devices);
  }
}
