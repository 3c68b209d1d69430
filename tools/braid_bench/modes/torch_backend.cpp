// braid-bench torch-backend: the same PyTorch program on the torch.distributed backends
// "gloo" and "braid" (the braid_torch module), one run: DistributedDataParallel's step time
// and exposed communication, then all_reduce's time from Python per message size. The
// program is tools/braid-torch-bench, run with a python3 that has torch and the build's
// braid_torch module on its path, given every option (checked here).

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <unistd.h>

#include "../harness/subprocess.hpp"
#include "modes.hpp"

namespace braid::bench {
namespace {

// The program's own defaults, checked here so that a bad value is braid-bench's one line.
struct TorchBackendOptions {
  int ranks = 2;
  int steps = 20;
  int width = 1024;
  int batch = 64;
  std::vector<std::string> programs{"ddp", "fsdp2"};
  std::vector<std::string> optimizers{"sgd", "adam"};
};

OptionTable table(TorchBackendOptions& o) {
  return {count("--ranks", o.ranks, 1, 64),
          count("--steps", o.steps, 1),
          count("--width", o.width, 1),
          count("--batch", o.batch, 1),
          words("--programs", o.programs, {"ddp", "fsdp2"}),
          words("--optimizers", o.optimizers, {"sgd", "adam"})};
}

int run(TorchBackendOptions& options) {
  const std::optional<std::string> python = torch_python();
  const std::filesystem::path script = sibling_program("braid-bench-torch-backend.py");
  // The module is built beside the tools' folder, in the build's python/ folder.
  const std::filesystem::path modules =
      std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "python";
  bool has_module = false;
  if (std::filesystem::is_directory(modules)) {
    for (const auto& entry : std::filesystem::directory_iterator(modules)) {
      has_module |= entry.path().filename().string().starts_with("braid_torch");
    }
  }
  if (!python || !std::filesystem::exists(script) || !has_module) {
    std::cerr << "braid-bench torch-backend: needs a python3 with torch"
              << (python ? "" : " (none found)") << ", " << script.string()
              << (std::filesystem::exists(script) ? "" : " (missing)")
              << " and the braid_torch module in " << modules.string()
              << (has_module ? ""
                             : " (not built: meson builds it where Python's torch and "
                               "pybind11 are found)")
              << "\n";
    return 1;
  }
  const char* path = std::getenv("PYTHONPATH");
  const std::string python_path =
      modules.string() + (path != nullptr && *path != '\0' ? ":" + std::string(path) : "");
  ::setenv("PYTHONPATH", python_path.c_str(), 1);
  std::vector<std::string> argv{*python, script.string()};
  for (auto& a : arguments(table(options), {"--ranks", "--steps", "--width", "--batch",
                                            "--programs", "--optimizers"}))
    argv.push_back(a);
  std::vector<char*> c_argv;
  for (std::string& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  std::cout.flush();
  ::execv(c_argv[0], c_argv.data());
  std::cerr << "braid-bench torch-backend: could not start " << *python << "\n";
  return 1;
}

}  // namespace

Mode torch_backend_mode() {
  return describe<TorchBackendOptions>(
      {.name = "torch-backend",
       .about = "one PyTorch DDP program on torch.distributed's \"gloo\" and \"braid\" backends "
                "in turn: step time and exposed communication, then all_reduce's time from "
                "Python, 1 KiB to 16 MiB, gloo's over braid's",
       .options = table,
       .run = run});
}

}  // namespace braid::bench
