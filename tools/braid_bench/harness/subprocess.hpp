// Running workers and peer programs (braid-run, mpirun, ucx_perftest, Python) from the
// benchmark driver.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace braid::bench {

struct CommandResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;  // stdout and stderr, interleaved
};

// Starts `argv` with its stdout and stderr on `output_fd` (/dev/null where it is -1);
// returns its pid. Throws std::runtime_error when fork fails; exits 127 when exec does.
int spawn(const std::vector<std::string>& argv, int output_fd);
// A waitpid() status as an exit code: the program's, 128 + signal when killed, -1 else.
int exit_status_of(int status);

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

// The path of a program installed beside this one (build/tools/, or the install bindir).
std::string sibling_program(const std::string& name);
// `program` (beside this one) under braid-run on `ranks` ranks, then `args`. With
// `one_blas_thread`, BLAS on one thread as libtorch's intra-op threads are: set_num_threads(1)
// does not reach Debian's OpenBLAS, whose own threads would otherwise take a second core at
// one rank and fight over the cores at two.
std::vector<std::string> under_braid_run(int ranks, const std::string& program,
                                         const std::vector<std::string>& args,
                                         bool one_blas_thread = false);
// braid-bench's own `mode` on `ranks` ranks under braid-run (which kills them after
// `timeout_s` where it is not 0), as the mode's measured ranks: `mode --worker`, then `args`.
std::vector<std::string> bench_worker(int ranks, const std::string& mode,
                                      const std::vector<std::string>& args, int timeout_s = 0);
// Moves the braid-run in `argv` (beside this program) onto `nodes` emulated nodes (with
// each link shaped to `link_rate` where not empty): its `-n` becomes `ranks` / `nodes`.
// Nothing where `nodes` is 0.
void on_emulated_nodes(std::vector<std::string>& argv, int nodes, const std::string& link_rate,
                       int ranks);
// A Python peer: `script` (beside this program) under torch_python(); nullopt where either is
// missing.
std::optional<std::vector<std::string>> python_peer(const std::string& script);
// Whether the worker `program` was built (it is, with libtorch); if not, says so on stderr.
bool have_worker(std::string_view mode, const std::string& program);
// A fixed command line written as one string: its words, split at spaces.
std::vector<std::string> words_of(std::string_view line);
// Whether an executable `name` is found on PATH.
bool on_path(const std::string& name);
// The Python that runs the torch peers: the one the build took PyTorch from (meson's
// -Dpython), else python3 on PATH, else /usr/bin/python3, the first that can import
// torch.distributed; nullopt when none has torch. Probed once.
std::optional<std::string> torch_python();

}  // namespace braid::bench
