// Running peer programs (braid-run, ucx_perftest) from the benchmark driver.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace braid::bench {

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;  // stdout and stderr, interleaved
};

// Runs `argv` to completion, capturing its output; kills it after `timeout`.
CommandResult run_command(const std::vector<std::string>& argv, std::chrono::seconds timeout);

// A program started in the background, killed (if still running) when this goes away.
class BackgroundProcess {
 public:
  explicit BackgroundProcess(const std::vector<std::string>& argv);
  ~BackgroundProcess();
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;
  // Waits up to `timeout` for it to exit; returns its exit code, or -1 after killing it.
  int wait(std::chrono::seconds timeout);

 private:
  int pid_ = -1;
};

// Waits until the machine's CPUs have been at least 90% idle over a 200 ms window, for at
// most 10 s, and says on stderr when they never were. Runners measured in turn start on a
// quiet machine: small all-reduces timed right after Gloo's Python processes exit (freeing
// gigabytes) ran 2x slower than the same sizes a few minutes later.
void wait_until_quiet();

// The path of a program installed beside this one (build/tools/, or the install bindir).
std::string sibling_program(const std::string& name);
// Whether an executable `name` is found on PATH.
bool on_path(const std::string& name);
// The Python that runs the torch peers: the one the build took PyTorch from (meson's
// -Dpython), else python3 on PATH, else /usr/bin/python3, the first that can import
// torch.distributed; nullopt when none has torch. Probed once.
std::optional<std::string> torch_python();

}  // namespace braid::bench
