#include "torch_backend.hpp"

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <unistd.h>

#include "subprocess.hpp"

namespace braid::bench {

int run_torch_backend(const std::vector<std::string>& args) {
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
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (std::string& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  std::cout.flush();
  ::execv(c_argv[0], c_argv.data());
  std::cerr << "braid-bench torch-backend: could not start " << *python << "\n";
  return 1;
}

}  // namespace braid::bench
