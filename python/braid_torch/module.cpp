// The braid_torch Python module: importing it registers braid as the torch.distributed
// backend "braid" (Backend.register_backend), whose process group is
// braid::torch::ProcessGroup (braid/torch/backend/process_group.hpp).
//
//   import braid_torch
//   torch.distributed.init_process_group("braid", init_method="env://", rank=r, world_size=n)
//
// braid_torch.new_process_group(store, rank, size, timeout) is the function registered:
// what init_process_group and new_group call with the prefix store they made. It releases
// the GIL while it joins, so a Python store's other users (and other threads) go on.
#include <chrono>
#include <pybind11/chrono.h>
#include <string>

#include <torch/csrc/utils/pybind.h>

#include <braid/build_config.hpp>
#include <braid/torch/backend/process_group.hpp>

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
  module.def(
      "announce_failure", [](const std::string& why) { braid::torch::announce_failure(why); },
      py::arg("why"), py::call_guard<py::gil_scoped_release>(),
      "Tells the ranks of every braid group this process joined that it is leaving through "
      "an error `why`: peers waiting on it fail at once, naming it.");
  // A Python exception that reaches the interpreter's top never unwinds through C++: the
  // groups would leave at exit as if cleanly, and peers waiting on this rank would wait
  // for their deadline. The hook announces the failure first, then hands the exception
  // to the hook it replaces (which prints it). Not for SystemExit, which Python handles
  // without the hook.
  py::object sys = py::module::import("sys");
  // Not in an interactive interpreter, where an exception ends one statement, not the rank.
  const bool interactive =
      py::hasattr(sys, "ps1") || sys.attr("flags").attr("interactive").cast<int>() != 0;
  if (!interactive && !py::hasattr(sys, "_braid_excepthook_installed")) {
    py::object previous = sys.attr("excepthook");
    sys.attr("excepthook") =
        py::cpp_function([previous](py::object type, py::object value, py::object traceback) {
          std::string why = "it raised an exception in Python";
          try {
            std::string detail = py::str(value);
            if (detail.size() > 200) detail = detail.substr(0, 200) + "...";
            why = "it raised " + std::string(py::str(type.attr("__name__"))) +
                  (detail.empty() ? "" : ": " + detail) + " in Python";
          } catch (const py::error_already_set&) {
            // An exception whose str() raises: announced without its text.
          }
          {
            py::gil_scoped_release release;
            braid::torch::announce_failure(why);
          }
          previous(type, value, traceback);
        });
    sys.attr("_braid_excepthook_installed") = true;
  }
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
