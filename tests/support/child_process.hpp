// Test support: run a program as a child process with its output captured, a scrubbed
// environment (the job's BRAID_* come from the test alone) and a hard time limit.
#pragma once

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fcntl.h>
#include <map>
#include <poll.h>
#include <spawn.h>
#include <string>
#include <string_view>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

extern char** environ;

namespace braid::testing {

using Clock = std::chrono::steady_clock;
using Env = std::map<std::string, std::string>;

struct Outcome {
  int status = -1;  // the exit code, or 128 + signal
  std::string out, err;
  Clock::duration elapsed{};
};

// What a launcher sets to say where a process stands (braid reads these).
inline bool is_launcher_variable(std::string_view name) {
  for (std::string_view prefix : {"SLURM_", "PET_", "OMPI_COMM_WORLD_", "PMIX_", "TORCHELASTIC_"}) {
    if (name.starts_with(prefix)) return true;
  }
  for (std::string_view exact : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                 "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    if (name == exact) return true;
  }
  return false;
}

// A program run as a child of the test, with its stdout and stderr captured. Anything
// still running after `limit` is killed and fails the test, so no test hangs.
class ChildProcess {
 public:
  explicit ChildProcess(std::vector<std::string> args, const Env& extra_env = {},
                        std::chrono::seconds limit = std::chrono::seconds(20))
      : limit_(limit) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string_view entry(*e);
      // The job's BRAID_* come from braid-run alone (a CI runner might set BRAID_TOKEN),
      // and OMP_NUM_THREADS, which braid-run sets, from the test alone.
      if (entry.starts_with("BRAID_") && !entry.starts_with("BRAID_LOG_LEVEL=")) continue;
      // Nor from a launcher the test itself runs under (a CI job in sbatch or in a pod).
      if (is_launcher_variable(entry.substr(0, entry.find('=')))) continue;
      if (entry.starts_with("OMP_NUM_THREADS=")) continue;
      // What the test passes replaces what it inherits.
      if (extra_env.contains(std::string(entry.substr(0, entry.find('='))))) continue;
      env.emplace_back(entry);
    }
    for (const auto& [name, value] : extra_env) env.push_back(name + "=" + value);

    argv0_ = args.at(0);
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    int out[2], err[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
    started_ = Clock::now();
    EXPECT_EQ(::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    ::close(err[1]);
    fds_[0] = out[0];
    fds_[1] = err[0];
  }

  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }

  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_; }

  // Reads output until stdout holds `count` copies of `text`, or braid-run closes it.
  void read_until(std::string_view text, int count) {
    auto occurrences = [&] {
      int n = 0;
      for (auto at = out_.find(text); at != std::string::npos; at = out_.find(text, at + 1)) ++n;
      return n;
    };
    while (occurrences() < count && pump()) {
    }
  }

  Outcome wait() {
    while (pump()) {
    }
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    Outcome outcome;
    outcome.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    outcome.out = out_;
    outcome.err = err_;
    outcome.elapsed = Clock::now() - started_;
    return outcome;
  }

 private:
  // One round of reading; false once both pipes are at their end (or time ran out).
  bool pump() {
    std::vector<pollfd> fds;
    for (int fd : fds_) {
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
    if (fds.empty()) return false;
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(started_ + limit_ - Clock::now());
    if (left.count() <= 0 || ::poll(fds.data(), fds.size(), static_cast<int>(left.count())) == 0) {
      ADD_FAILURE() << argv0_ << " still running after " << limit_.count() << " s; stdout:\n"
                    << out_ << "stderr:\n"
                    << err_;
      ::kill(pid_, SIGKILL);
      return false;
    }
    for (int i = 0; i < 2; ++i) {
      pollfd p{fds_[i], POLLIN, 0};
      if (fds_[i] < 0 || ::poll(&p, 1, 0) <= 0) continue;
      char buffer[4096];
      ssize_t n = ::read(fds_[i], buffer, sizeof buffer);
      if (n > 0) {
        (i == 0 ? out_ : err_).append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds_[i]);
        fds_[i] = -1;
      }
    }
    return true;
  }

  std::chrono::seconds limit_;
  std::string argv0_;
  pid_t pid_ = -1;
  int fds_[2] = {-1, -1};
  std::string out_, err_;
  Clock::time_point started_;
};

inline Outcome run_child(std::vector<std::string> args, const Env& env = {}) {
  return ChildProcess(std::move(args), env).wait();
}

// The path of a program the build passes to the test in environment variable `name`.
inline std::string program_from_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) {
    ADD_FAILURE() << name << " is not set; meson passes the path of the built program";
    return "/nonexistent";
  }
  return value;
}

}  // namespace braid::testing
