#include "subprocess.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <netinet/in.h>
#include <signal.h>
#include <sstream>
#include <stdexcept>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace braid::bench {
namespace {

std::vector<char*> c_argv(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const auto& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

// Polls waitpid until `pid` exits or `timeout` passes; -1 on timeout.
int wait_with_timeout(int pid, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return exit_status_of(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

}  // namespace

int spawn(const std::vector<std::string>& argv, int output_fd) {
  auto args = c_argv(argv);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    if (output_fd >= 0) {
      dup2(output_fd, STDOUT_FILENO);
      dup2(output_fd, STDERR_FILENO);
    } else {
      const int null_fd = open("/dev/null", O_WRONLY);
      dup2(null_fd, STDOUT_FILENO);
      dup2(null_fd, STDERR_FILENO);
    }
    execvp(args[0], args.data());
    _exit(127);
  }
  return pid;
}

int exit_status_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

CommandResult run_command(const std::vector<std::string>& argv, std::chrono::seconds timeout) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
  const int pid = spawn(argv, pipe_fds[1]);
  close(pipe_fds[1]);
  fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
  CommandResult result;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char chunk[4096];
  int status = 0;
  for (;;) {
    const ssize_t n = read(pipe_fds[0], chunk, sizeof chunk);
    if (n > 0) {
      result.output.append(chunk, static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0) break;  // every writer closed: the program (and its children) are done
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      result.output += "\n(killed after the benchmark's timeout)\n";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  close(pipe_fds[0]);
  waitpid(pid, &status, 0);
  result.exit_code = exit_status_of(status);
  return result;
}

BackgroundProcess::BackgroundProcess(const std::vector<std::string>& argv)
    : pid_(spawn(argv, -1)) {}

BackgroundProcess::~BackgroundProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

int BackgroundProcess::wait(std::chrono::seconds timeout) {
  const int code = wait_with_timeout(pid_, timeout);
  if (code >= 0) pid_ = -1;
  return code;
}

std::string sibling_program(const std::string& name) {
  const auto self = std::filesystem::read_symlink("/proc/self/exe");
  return (self.parent_path() / name).string();
}

std::vector<std::string> under_braid_run(int ranks, const std::string& program,
                                         const std::vector<std::string>& args,
                                         bool one_blas_thread) {
  std::vector<std::string> argv;
  if (one_blas_thread) argv = {"env", "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"};
  argv.insert(argv.end(), {sibling_program("braid-run"), "-n", std::to_string(ranks),
                           sibling_program(program)});
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::vector<std::string> bench_worker(int ranks, const std::string& mode,
                                      const std::vector<std::string>& args, int timeout_s) {
  std::vector<std::string> argv{sibling_program("braid-run"), "-n", std::to_string(ranks)};
  if (timeout_s > 0) argv.insert(argv.end(), {"--timeout", std::to_string(timeout_s)});
  argv.insert(argv.end(), {sibling_program("braid-bench"), mode, "--worker"});
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

void on_emulated_nodes(std::vector<std::string>& argv, int nodes, const std::string& link_rate,
                       int ranks) {
  if (nodes == 0) return;
  const auto braid_run = std::find(argv.begin(), argv.end(), sibling_program("braid-run"));
  if (braid_run == argv.end()) throw std::logic_error("on_emulated_nodes: no braid-run in argv");
  const auto per_node = std::find(braid_run, argv.end(), "-n");
  if (per_node == argv.end()) throw std::logic_error("on_emulated_nodes: braid-run has no -n");
  *(per_node + 1) = std::to_string(ranks / nodes);
  std::vector<std::string> flags{"--emulate-nodes", std::to_string(nodes)};
  if (!link_rate.empty()) flags.insert(flags.end(), {"--link-rate", link_rate});
  argv.insert(braid_run + 1, flags.begin(), flags.end());
}

std::optional<std::vector<std::string>> python_peer(const std::string& script) {
  const std::optional<std::string> python = torch_python();
  const std::string path = sibling_program(script);
  if (!python || !std::filesystem::exists(path)) return std::nullopt;
  return std::vector<std::string>{*python, path};
}

bool have_worker(std::string_view mode, const std::string& program) {
  if (std::filesystem::exists(sibling_program(program))) return true;
  std::cerr << "braid-bench " << mode << ": the worker is built with libtorch only\n";
  return false;
}

std::vector<std::string> words_of(std::string_view line) {
  std::vector<std::string> words;
  std::istringstream stream{std::string(line)};
  for (std::string word; stream >> word;) words.push_back(word);
  return words;
}

namespace {

// The first executable `name` on PATH, as a full path.
std::optional<std::string> find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return std::nullopt;
  std::string_view rest(path);
  while (!rest.empty()) {
    const auto colon = rest.find(':');
    const auto candidate = std::filesystem::path(rest.substr(0, colon)) / name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return std::nullopt;
}

}  // namespace

bool on_path(const std::string& name) {
  return find_on_path(name).has_value();
}

std::optional<std::string> torch_python() {
  static const std::optional<std::string> found = []() -> std::optional<std::string> {
    std::vector<std::string> candidates;
    // The Python the build took libtorch from (meson's -Dpython): the peers then run the
    // same PyTorch braid was built against.
    if (std::string_view(BRAID_TORCH_PYTHON) != "") candidates.emplace_back(BRAID_TORCH_PYTHON);
    if (auto python = find_on_path("python3")) candidates.push_back(*python);
    candidates.emplace_back("/usr/bin/python3");
    for (const std::string& python : candidates) {
      if (access(python.c_str(), X_OK) != 0) continue;
      const auto probe =
          run_command({python, "-c", "import torch.distributed"}, std::chrono::seconds(60));
      if (probe.exit_code == 0) return python;
    }
    return std::nullopt;
  }();
  return found;
}

}  // namespace braid::bench
