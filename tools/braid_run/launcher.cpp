#include "launcher.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <random>
#include <stdexcept>
#include <string_view>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <system_error>
#include <unistd.h>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <braid/core/config.hpp>
#include <braid/transport/bootstrap.hpp>

#include "rendezvous.hpp"

extern char** environ;

namespace braid::launcher {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void throw_errno(std::string_view what) {
  throw std::system_error(errno, std::generic_category(), std::string(what));
}

// Blocks until every byte is written. Output nobody reads any more (a closed pipe, EPIPE)
// is dropped: losing a log line must not leave the ranks unsupervised.
void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n >= 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else if (errno != EINTR) {
      return;
    }
  }
}

// Who speaks in braid-run's lines: "braid-run", or across nodes "braid-run (node 1)", since
// the nodes' lines end up in one log (Slurm's, the emulation's terminal).
std::string& speaker() {
  static std::string name = "braid-run";
  return name;
}

void report(std::string_view message) {
  write_all(STDERR_FILENO, fmt::format("{}: {}\n", speaker(), message));
}

// poll()'s timeout until `next` (max: none), at most a minute, so a clock step never
// leaves the loop asleep for long.
int poll_timeout_ms(Clock::time_point next) {
  if (next == Clock::time_point::max()) return -1;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now());
  return static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 60'000));
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

// Why braid-run stopped the job itself, as the job's failure log says it.
std::string received(int sig) {
  return fmt::format("braid-run received {}", signal_name(sig));
}

// How a generation ended, in a few words: "done", "failed: ...".
std::string describe(const GenerationEnd& end) {
  switch (end.kind) {
    case GenerationEnd::Kind::done:
      return "done";
    case GenerationEnd::Kind::restart:
      return fmt::format("restarting: {}", end.why);
    case GenerationEnd::Kind::failed:
    case GenerationEnd::Kind::store_lost:
      break;
  }
  return fmt::format("failed: {}", end.why);
}

std::string random_token() {
  std::random_device device;  // getrandom() on Linux
  std::string token;
  for (int i = 0; i < 4; ++i) token += fmt::format("{:08x}", device());
  return token;
}

// One of a rank's output pipes and the partial line read from it so far.
struct Stream {
  int fd = -1;  // read end; -1 once closed
  int out_fd = STDOUT_FILENO;
  std::string pending;
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  std::string prefix;  // "[3] "
  std::array<Stream, 2> streams;
};

class Job {
 public:
  explicit Job(const LaunchOptions& options) : options_(options) {}
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  int run();

 private:
  void take_signals();
  int start_emulated_nodes();
  // What an emulated node runs: its main process, and beside it a launch agent (or none).
  struct NodeCommand {
    std::vector<std::string> argv;
    std::vector<std::string> agent;
  };
  NodeCommand node_braid_run(const std::string& self, int node) const;
  NodeCommand first_node_command(const std::string& self, int node) const;
  std::vector<std::string> rank_environment(int local_rank) const;
  void start_rank(int local_rank);
  void supervise();
  void read_stream(Rank& rank, Stream& stream);
  void drain(Rank& rank);
  void flush(Rank& rank, Stream& stream);
  void reap_children();
  void on_rank_exit(Rank& rank, int status);
  void give_verdict();
  void on_signal(int sig);
  void stop(int sig);
  void kill_remaining();
  int running_count() const;
  void close_streams();
  void make_snapshot_fds();
  void close_snapshot_fds();
  void on_generation_end();
  GenerationEnd end_of_generation();
  GenerationEnd wait_for_end();
  int conclude(const GenerationEnd& end);
  void start_again();
  void replace_node(Rank& node, int status);
  std::string timeout_reason() const;

  const LaunchOptions& options_;
  // What the job's members are: this node's ranks, or (--emulate-nodes) the nodes, each
  // a braid-run of its own under an init braid-run supervises like a rank.
  const char* noun_ = "rank";
  const Rank* primary_ = nullptr;  // --on-first-node: node 0, whose end is the job's
  std::optional<EmulatedNodes> emulation_;
  std::vector<std::string> shared_env_;  // the parent's environment plus the job-wide BRAID_*
  std::vector<std::string> node_env_;    // --emulate-nodes: what each node's init is given
  std::string self_;                     // --emulate-nodes: this braid-run's executable
  std::vector<Rank> ranks_;
  int signal_fd_ = -1;
  sigset_t old_mask_{};
  int exit_status_ = 0;
  bool stopping_ = false;
  bool rank_failed_ = false;  // the job stopped because a rank failed (a restart may follow)
  std::string verdict_;       // what give_verdict() said of it
  std::string stop_reason_;   // why braid-run stopped the ranks itself (a signal, --timeout)
  // The job's store (served here on node 0) and its generations: each start of the ranks
  // is one, the same on every node (rendezvous.hpp).
  std::optional<Rendezvous> rendezvous_;
  std::int64_t generation_ = 0;
  // This generation's nodes: how many, and this node's place among them (the rendezvous's
  // members; every node of --nnodes N, in order, unless --nnodes MIN:MAX let some go).
  int node_count_ = 0;
  int node_index_ = 0;
  int first_rank() const { return node_index_ * options_.nproc_per_node; }
  int fewest_nodes() const {
    return options_.min_nnodes > 0 ? options_.min_nnodes : options_.nnodes;
  }
  bool ended_elsewhere_ = false;  // another node ended this generation: ranks stopped here
  int replaced_nodes_ = 0;        // --emulate-nodes with --max-restarts: nodes started again
  // Per local rank, the memfds its in-memory checkpoints live in (MemoryCheckpoints):
  // braid-run's, so a rank's copies outlive its process and reach its next start. Two for
  // its own copies; across nodes two more for its partner's, a rank on another node.
  std::vector<std::vector<int>> snapshot_fds_;
  std::optional<Clock::time_point> kill_at_;  // SIGKILL for ranks still running then
  Clock::time_point deadline_ = Clock::time_point::max();
  // Failed ranks seen within kSettle of the first failure, in the order seen, and when
  // braid-run names one of them and stops the rest.
  struct Failure {
    const Rank* rank;
    int status;
  };
  std::vector<Failure> failures_;
  std::optional<Clock::time_point> verdict_at_;
};

// How long braid-run waits after a rank fails before it names the failure and stops the
// others. A rank killed by a signal (SIGKILL, a crash) is what its peers then fail on:
// they can notice its death (its sockets close as it exits) before braid-run reaps it,
// and exit with an error of their own first. Waiting this long for its exit status names
// the cause, not the first consequence.
constexpr auto kSettle = std::chrono::milliseconds(200);

// The variables braid-run sets; each must be a declared knob.
constexpr std::array kRankVariables{
    "BRAID_RANK",          "BRAID_WORLD_SIZE",   "BRAID_LOCAL_RANK",      "BRAID_LOCAL_WORLD_SIZE",
    "BRAID_NODE_RANK",     "BRAID_NNODES",       "BRAID_STORE",           "BRAID_TOKEN",
    "BRAID_RESTART_COUNT", "BRAID_SNAPSHOT_FDS", "BRAID_STORE_SERVED_BY", "BRAID_STORE_PREFIX"};

// torchrun's variables, set too so that PyTorch's init_method="env://" (and any program
// written for torchrun) runs under braid-run unchanged. Not knobs: braid does not read them.
constexpr std::array kTorchVariables{
    "RANK",       "WORLD_SIZE",  "LOCAL_RANK",  "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"};

Job::~Job() {
  close_streams();
  close_snapshot_fds();
  if (signal_fd_ >= 0) {
    ::close(signal_fd_);
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  }
}

// Two memfds per local rank, four across nodes. Where memfds are refused (a seccomp
// filter), the ranks go without: an in-memory checkpoint then lives in the rank's own
// memory, and says so.
void Job::make_snapshot_fds() {
  const std::size_t per_rank = options_.nnodes > 1 ? 4 : 2;
  for (int i = 0; i < options_.nproc_per_node; ++i) {
    auto& slots = snapshot_fds_.emplace_back(per_rank, -1);
    for (std::size_t k = 0; k < slots.size(); ++k) {
      const std::string name = fmt::format("braid-run-rank-{}-slot-{}",
                                           options_.node_rank * options_.nproc_per_node + i, k);
      slots[k] = ::memfd_create(name.c_str(), MFD_CLOEXEC);
      if (slots[k] < 0) {
        report(fmt::format("no memory for in-memory checkpoints to outlive a rank: {}",
                           std::strerror(errno)));
        close_snapshot_fds();
        return;
      }
    }
  }
}

void Job::close_snapshot_fds() {
  for (const auto& fds : snapshot_fds_) {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  snapshot_fds_.clear();
}

void Job::close_streams() {
  for (Rank& rank : ranks_) {
    for (Stream& s : rank.streams) {
      if (s.fd >= 0) ::close(std::exchange(s.fd, -1));
    }
  }
}

int Job::running_count() const {
  int n = 0;
  for (const Rank& rank : ranks_) n += rank.running ? 1 : 0;
  return n;
}

std::vector<std::string> Job::rank_environment(int local_rank) const {
  std::vector<std::string> env = shared_env_;
  const int rank = first_rank() + local_rank;
  const int world = node_count_ * options_.nproc_per_node;
  env.push_back(fmt::format("BRAID_WORLD_SIZE={}", world));
  env.push_back(fmt::format("WORLD_SIZE={}", world));
  env.push_back(fmt::format("BRAID_NODE_RANK={}", node_index_));
  env.push_back(fmt::format("GROUP_RANK={}", node_index_));
  env.push_back(fmt::format("BRAID_NNODES={}", node_count_));
  env.push_back(fmt::format("BRAID_RANK={}", rank));
  env.push_back(fmt::format("BRAID_LOCAL_RANK={}", local_rank));
  env.push_back(fmt::format("RANK={}", rank));
  env.push_back(fmt::format("LOCAL_RANK={}", local_rank));
  env.push_back(fmt::format("BRAID_RESTART_COUNT={}", generation_));
  env.push_back(fmt::format("TORCHELASTIC_RESTART_COUNT={}", generation_));
  env.push_back(fmt::format("BRAID_STORE_PREFIX={}", Rendezvous::key_prefix(generation_)));
  if (!snapshot_fds_.empty()) {
    env.push_back(fmt::format("BRAID_SNAPSHOT_FDS={}",
                              fmt::join(snapshot_fds_[static_cast<std::size_t>(local_rank)], ",")));
  }
  return env;
}

void Job::start_rank(int local_rank) {
  Rank& rank = ranks_.emplace_back();
  rank.rank = first_rank() + local_rank;
  rank.prefix = fmt::format("[{}] ", rank.rank);

  // Everything the child needs is built before fork(): between fork and exec only
  // async-signal-safe calls are allowed.
  std::vector<std::string> env = rank_environment(local_rank);
  std::vector<char*> envp, argv;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> command = options_.command;
  for (std::string& a : command) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::array<std::array<int, 2>, 2> pipes{{{-1, -1}, {-1, -1}}};
  if (options_.prefix_output) {
    for (auto& p : pipes) {
      if (::pipe2(p.data(), O_CLOEXEC) != 0) throw_errno("pipe2");
    }
  }
  // exec() closes this pipe's write end; an errno arriving on it means exec failed.
  std::array<int, 2> exec_pipe{};
  if (::pipe2(exec_pipe.data(), O_CLOEXEC) != 0) throw_errno("pipe2");

  const pid_t supervisor = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork");
  if (pid == 0) {
    // A rank outlives no braid-run: killed with it, as a node's processes die with the node,
    // rather than left running unsupervised. (The main thread forks and lives as long as
    // braid-run: the signal follows the thread that forked.)
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != supervisor) ::_exit(1);
    ::setpgid(0, 0);
    ::signal(SIGPIPE, SIG_DFL);  // ignored in braid-run, and ignoring survives exec
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    if (!snapshot_fds_.empty()) {
      for (int fd : snapshot_fds_[static_cast<std::size_t>(local_rank)]) ::fcntl(fd, F_SETFD, 0);
    }
    if (options_.prefix_output) {
      ::dup2(pipes[0][1], STDOUT_FILENO);
      ::dup2(pipes[1][1], STDERR_FILENO);
    }
    ::execvpe(argv[0], argv.data(), envp.data());
    int error = errno;
    ssize_t ignored = ::write(exec_pipe[1], &error, sizeof error);
    static_cast<void>(ignored);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so the group exists before we might signal it
  rank.pid = pid;
  rank.running = true;
  for (std::size_t i = 0; i < pipes.size(); ++i) {
    if (!options_.prefix_output) break;
    ::close(pipes[i][1]);
    ::fcntl(pipes[i][0], F_SETFL, O_NONBLOCK);
    rank.streams[i].fd = pipes[i][0];
    rank.streams[i].out_fd = i == 0 ? STDOUT_FILENO : STDERR_FILENO;
  }
  ::close(exec_pipe[1]);
  int error = 0;
  ssize_t n;
  do {
    n = ::read(exec_pipe[0], &error, sizeof error);
  } while (n < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  if (n == sizeof error) {
    ::waitpid(pid, nullptr, 0);
    rank.running = false;
    drain(rank);
    exit_status_ = error == ENOENT ? 127 : 126;
    stopping_ = true;
    int others = running_count();
    stop_reason_ =
        fmt::format("cannot execute '{}': {}", options_.command.front(), std::strerror(error));
    report(fmt::format("{}{}", stop_reason_,
                       others > 0 ? fmt::format("; stopping the {} started rank(s)", others) : ""));
    stop(SIGTERM);
  }
}

void Job::read_stream(Rank& rank, Stream& stream) {
  // Lines longer than this are cut, so a rank printing without newlines cannot grow
  // braid-run's memory without bound.
  constexpr std::size_t kMaxLine = std::size_t{64} << 10;
  std::array<char, std::size_t{64} << 10> buffer;
  while (stream.fd >= 0) {
    ssize_t n = ::read(stream.fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {
      flush(rank, stream);
      ::close(stream.fd);
      stream.fd = -1;
      return;
    }
    stream.pending.append(buffer.data(), static_cast<std::size_t>(n));
    std::string out;
    std::size_t start = 0;
    for (std::size_t end; (end = stream.pending.find('\n', start)) != std::string::npos;
         start = end + 1) {
      out += rank.prefix;
      out.append(stream.pending, start, end + 1 - start);
    }
    stream.pending.erase(0, start);
    if (stream.pending.size() > kMaxLine) {
      out += rank.prefix + stream.pending + '\n';
      stream.pending.clear();
    }
    write_all(stream.out_fd, out);
  }
}

void Job::flush(Rank& rank, Stream& stream) {
  if (stream.pending.empty()) return;
  write_all(stream.out_fd, rank.prefix + stream.pending + '\n');
  stream.pending.clear();
}

// A rank that has exited has written all it will (unless it left children behind):
// read what is in its pipes so its last words print before braid-run's verdict.
void Job::drain(Rank& rank) {
  for (Stream& s : rank.streams) {
    read_stream(rank, s);
    flush(rank, s);
  }
}

void Job::on_rank_exit(Rank& rank, int status) {
  rank.running = false;
  drain(rank);
  if (&rank == primary_) {
    // The job is this member's (--on-first-node): the rest only served it.
    if (!stopping_) {
      exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      stopping_ = true;
      stop(SIGTERM);
    }
    return;
  }
  const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  if (!failed || stopping_) return;
  // An emulated node killed whole (its init, by a signal: a node's braid-run that ends
  // exits) is started again, as a cluster's scheduler replaces a failed node; node 0 serves
  // the job's store and cannot be, unless the store is an etcd cluster.
  if (emulation_ && !primary_ && WIFSIGNALED(status) &&
      (rank.rank != 0 || !options_.store_url.empty()) && replaced_nodes_ < options_.max_restarts) {
    replace_node(rank, status);
    return;
  }
  failures_.push_back({&rank, status});
  // A death by a signal is a cause, never a consequence: named at once, so that across nodes
  // this node ends the generation before another whose ranks failed on it (and still wait
  // out their settle) names a consequence instead.
  if (WIFSIGNALED(status)) {
    verdict_at_ = Clock::now();
  } else if (!verdict_at_) {
    verdict_at_ = Clock::now() + kSettle;
  }
}

void Job::give_verdict() {
  verdict_at_.reset();
  if (failures_.empty() || stopping_) return;
  // The first rank a signal ended, else the first that failed.
  const auto signalled = std::find_if(failures_.begin(), failures_.end(),
                                      [](const Failure& f) { return !WIFEXITED(f.status); });
  const Failure culprit = signalled != failures_.end() ? *signalled : failures_.front();
  exit_status_ =
      WIFEXITED(culprit.status) ? WEXITSTATUS(culprit.status) : 128 + WTERMSIG(culprit.status);
  auto how = [](int status) {
    return WIFEXITED(status) ? fmt::format("exited with code {}", WEXITSTATUS(status))
                             : fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                                           signal_name(WTERMSIG(status)));
  };
  std::string also;
  for (const Failure& f : failures_) {
    if (f.rank == culprit.rank) continue;
    also += fmt::format("{}{} {} {}", also.empty() ? "; also " : ", ", noun_, f.rank->rank,
                        how(f.status));
  }
  const int others = running_count();
  rank_failed_ = true;
  verdict_ = fmt::format("{} {} (pid {}) {}{}", noun_, culprit.rank->rank, culprit.rank->pid,
                         how(culprit.status), also);
  report(
      fmt::format("{}{}", verdict_,
                  others > 0 ? fmt::format("; stopping the other {} {}(s)", others, noun_) : ""));
  stopping_ = true;
  stop(SIGTERM);
}

void Job::reap_children() {
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    for (Rank& rank : ranks_) {
      if (rank.pid == pid && rank.running) on_rank_exit(rank, status);
    }
  }
}

void Job::on_signal(int sig) {
  if (stopping_) {
    // A second Ctrl-C means now.
    report(fmt::format("received {} while stopping; killing {} {}(s)", signal_name(sig),
                       running_count(), noun_));
    kill_remaining();
    return;
  }
  stopping_ = true;
  exit_status_ = 128 + sig;
  stop_reason_ = received(sig);
  report(fmt::format("received {}; forwarding it to {} {}(s)", signal_name(sig), running_count(),
                     noun_));
  stop(sig);
}

void Job::stop(int sig) {
  for (const Rank& rank : ranks_) {
    if (rank.running) ::kill(-rank.pid, sig);
  }
  // A node's braid-run gives its ranks the grace, then reports: a little longer for it.
  auto grace = std::chrono::duration_cast<Clock::duration>(options_.grace) +
               (emulation_ ? std::chrono::seconds(2) : std::chrono::seconds(0));
  if (!kill_at_) kill_at_ = Clock::now() + grace;
}

void Job::kill_remaining() {
  for (const Rank& rank : ranks_) {
    if (rank.running) ::kill(-rank.pid, SIGKILL);
  }
}

void Job::supervise() {
  std::vector<pollfd> fds;
  std::vector<std::pair<Rank*, Stream*>> owners;
  while (running_count() > 0 || verdict_at_) {
    if (running_count() == 0) {
      give_verdict();  // nobody left to wait for
      break;
    }
    fds.assign(1, pollfd{signal_fd_, POLLIN, 0});
    owners.assign(1, {nullptr, nullptr});
    if (rendezvous_) {
      fds.push_back({rendezvous_->wakeup_fd(), POLLIN, 0});
      owners.emplace_back(nullptr, nullptr);
    }
    for (Rank& rank : ranks_) {
      for (Stream& s : rank.streams) {
        if (s.fd < 0) continue;
        fds.push_back({s.fd, POLLIN, 0});
        owners.emplace_back(&rank, &s);
      }
    }
    auto next = kill_at_ ? std::min(*kill_at_, deadline_) : deadline_;
    if (verdict_at_) next = std::min(next, *verdict_at_);
    if (::poll(fds.data(), fds.size(), poll_timeout_ms(next)) < 0 && errno != EINTR) {
      throw_errno("poll");
    }

    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (owners[i].first == nullptr) {
        on_generation_end();
      } else {
        read_stream(*owners[i].first, *owners[i].second);
      }
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info{};
      while (::read(signal_fd_, &info, sizeof info) == sizeof info) {
        if (info.ssi_signo == SIGCHLD) {
          reap_children();
        } else {
          on_signal(static_cast<int>(info.ssi_signo));
        }
      }
    }
    auto now = Clock::now();
    if (verdict_at_ && now >= *verdict_at_) give_verdict();
    if (!stopping_ && now >= deadline_) {
      stopping_ = true;
      exit_status_ = 124;  // what timeout(1) returns
      stop_reason_ = timeout_reason();
      report(fmt::format("{}; stopping {} {}(s)", stop_reason_, running_count(), noun_));
      stop(SIGTERM);
    }
    if (kill_at_ && now >= *kill_at_) {
      for (const Rank& rank : ranks_) {
        if (!rank.running) continue;
        report(fmt::format("{} {} (pid {}) did not stop within {:g} s; sending SIGKILL", noun_,
                           rank.rank, rank.pid,
                           std::chrono::duration<double>(options_.grace).count()));
      }
      kill_remaining();
      kill_at_ = Clock::time_point::max();
    }
  }
}

// Signals arrive through the signalfd, in the poll loop, never in a handler.
void Job::take_signals() {
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM}) sigaddset(&mask, sig);
  if (::sigprocmask(SIG_BLOCK, &mask, &old_mask_) != 0) throw_errno("sigprocmask");
  signal_fd_ = ::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd_ < 0) throw_errno("signalfd");
  ::signal(SIGPIPE, SIG_IGN);
  if (options_.timeout) {
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(*options_.timeout);
  }
}

// --emulate-nodes: the members are nodes, each running a braid-run of its own for its
// ranks (which prefixes and supervises them as on a real node), or with --on-first-node the
// program on node 0 and launch agents; this braid-run supervises the nodes' inits as it
// would ranks: a failed node stops the others, signals and the timeout reach every node's
// processes through their node's init.
int Job::start_emulated_nodes() {
  noun_ = "node";
  std::string token = config::string_value("BRAID_TOKEN");
  if (token.empty()) token = random_token();  // one secret for every node's braid-run
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!std::string_view(*e).starts_with("BRAID_TOKEN=")) env.emplace_back(*e);
  }
  env.push_back(fmt::format("BRAID_TOKEN={}", token));
  std::array<char, 4096> self{};
  if (::readlink("/proc/self/exe", self.data(), self.size() - 1) < 0) {
    throw_errno("readlink /proc/self/exe");
  }
  self_ = self.data();
  take_signals();
  emulation_.emplace(options_.emulate_nodes, options_.link_rate);
  if (options_.on_first_node && std::getenv("OMPI_MCA_plm_rsh_agent") == nullptr) {
    env.push_back(fmt::format("OMPI_MCA_plm_rsh_agent={} --on-node", self_));
  }
  node_env_ = env;
  ranks_.reserve(static_cast<std::size_t>(options_.emulate_nodes));  // replace_node keeps them
  for (int node = 0; node < options_.emulate_nodes && !stopping_; ++node) {
    const NodeCommand command =
        options_.on_first_node ? first_node_command(self_, node) : node_braid_run(self_, node);
    Rank& member = ranks_.emplace_back();
    member.rank = node;
    member.pid = emulation_->start_node(node, command.argv, env, old_mask_, command.agent);
    member.running = true;
  }
  if (options_.on_first_node && !ranks_.empty()) primary_ = &ranks_.front();
  supervise();
  for (const std::string& line : emulation_->traffic_report()) report(line);
  return exit_status_;
}

// A node's braid-run for its ranks, with the job's node count, its node rank and node 0's
// address, as on a cluster.
Job::NodeCommand Job::node_braid_run(const std::string& self, int node) const {
  std::vector<std::string> argv{
      self,
      "--nproc-per-node",
      std::to_string(options_.nproc_per_node),
      "--nnodes",
      std::to_string(options_.emulate_nodes),
      "--node-rank",
      std::to_string(node),
      "--master-addr",
      EmulatedNodes::address_of(0),
      "--grace",
      fmt::format("{:g}", std::chrono::duration<double>(options_.grace).count())};
  if (options_.master_port) {
    argv.insert(argv.end(), {"--master-port", std::to_string(*options_.master_port)});
  }
  if (!options_.prefix_output) argv.emplace_back("--no-prefix");
  if (options_.max_restarts > 0) {
    argv.insert(argv.end(), {"--max-restarts", std::to_string(options_.max_restarts)});
  }
  if (!options_.store_url.empty()) argv.insert(argv.end(), {"--store", options_.store_url});
  argv.emplace_back("--");
  argv.insert(argv.end(), options_.command.begin(), options_.command.end());
  return {.argv = std::move(argv), .agent = {}};
}

// --on-first-node: node 0 runs the program itself, and every node its launch agent
// (node_agent.hpp), through which the program starts what it runs on the others. The job
// is the program's (primary_): when it ends, the agents are stopped and its status is
// braid-run's.
Job::NodeCommand Job::first_node_command(const std::string& self, int node) const {
  std::vector<std::string> serve{self, "--serve-node-agent", EmulatedNodes::address_of(node)};
  if (node != 0) return {.argv = std::move(serve), .agent = {}};
  std::vector<std::string> argv{"/usr/bin/env"};  // finds the program on PATH, as a shell would
  argv.insert(argv.end(), options_.command.begin(), options_.command.end());
  return {.argv = std::move(argv), .agent = std::move(serve)};
}

// The generation being run ended elsewhere (another node's launcher, or its will), or the
// store is gone: this node's ranks stop, as their peers do.
void Job::on_generation_end() {
  rendezvous_->clear_wakeup();
  const std::optional<GenerationEnd> end = rendezvous_->ended();
  // A ring from a generation before this one (which this launcher ended itself) says
  // nothing of this one.
  if (!end || stopping_) return;
  ended_elsewhere_ = true;
  stopping_ = true;
  const int running = running_count();
  report(fmt::format(
      "{}{}",
      end->kind == GenerationEnd::Kind::store_lost
          ? fmt::format("lost the job's store on {}: {}", rendezvous_->where(), end->why)
          : fmt::format("the job stopped on another node: {}", end->why),
      running > 0 ? fmt::format("; stopping this node's {} rank(s)", running) : ""));
  stop(SIGTERM);
}

// Once this node's ranks are all down: how the generation ended, ending it here first
// where this node has cause to.
GenerationEnd Job::end_of_generation() {
  if (rank_failed_ && !ended_elsewhere_) {
    return rendezvous_->end_by_failure(exit_status_, verdict_, /*may_restart=*/true);
  }
  if (ended_elsewhere_) return *rendezvous_->ended();
  if (stopping_) {
    return rendezvous_->end_by_failure(exit_status_, stop_reason_, /*may_restart=*/false);
  }
  rendezvous_->finished();
  return wait_for_end();
}

// This node's ranks all exited with 0: the job is done once every node's have, unless
// another node fails first (then a restart may follow: every node runs the generation
// again). Signals and --timeout still apply while waiting.
GenerationEnd Job::wait_for_end() {
  for (;;) {
    if (std::optional<GenerationEnd> end = rendezvous_->ended()) return *end;
    std::array<pollfd, 2> fds{pollfd{signal_fd_, POLLIN, 0},
                              pollfd{rendezvous_->wakeup_fd(), POLLIN, 0}};
    if (::poll(fds.data(), fds.size(), poll_timeout_ms(deadline_)) < 0 && errno != EINTR) {
      throw_errno("poll");
    }
    if (fds[1].revents & POLLIN) rendezvous_->clear_wakeup();
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info{};
      while (::read(signal_fd_, &info, sizeof info) == sizeof info) {
        if (info.ssi_signo == SIGCHLD) continue;
        exit_status_ = 128 + static_cast<int>(info.ssi_signo);
        return rendezvous_->end_by_failure(exit_status_, received(static_cast<int>(info.ssi_signo)),
                                           /*may_restart=*/false);
      }
    }
    if (Clock::now() >= deadline_) {
      exit_status_ = 124;
      return rendezvous_->end_by_failure(exit_status_, timeout_reason(), /*may_restart=*/false);
    }
  }
}

// The job is over: braid-run's exit status, and the failures that ended it named.
int Job::conclude(const GenerationEnd& end) {
  int status = exit_status_;
  switch (end.kind) {
    case GenerationEnd::Kind::restart:
    case GenerationEnd::Kind::done:
      status = 0;
      break;
    case GenerationEnd::Kind::failed: {
      status = end.status;
      if (!end.ours) report(fmt::format("the job failed: {}", end.why));
      const std::vector<std::string> failures = rendezvous_->failures();
      if (failures.size() > 1) {
        std::string all;
        for (const std::string& f : failures)
          all += fmt::format("{}{}", all.empty() ? "" : "; ", f);
        report(
            fmt::format("the job failed after {} restart(s) (--max-restarts {}); its failures: {}",
                        rendezvous_->restarts_used(), options_.max_restarts, all));
      }
      break;
    }
    case GenerationEnd::Kind::store_lost:
      status = end.status;
      if (!ended_elsewhere_) {
        report(fmt::format("lost the job's store on {}: {}", rendezvous_->where(), end.why));
      }
      return status;  // nobody left to tell
  }
  rendezvous_->leave();
  return status;
}

std::string Job::timeout_reason() const {
  return fmt::format("the job ran longer than --timeout {:g} s",
                     std::chrono::duration<double>(*options_.timeout).count());
}

void Job::start_again() {
  close_streams();
  ranks_.clear();
  failures_.clear();
  rank_failed_ = stopping_ = ended_elsewhere_ = false;
  verdict_.clear();
  stop_reason_.clear();
  exit_status_ = 0;
  kill_at_.reset();
  verdict_at_.reset();
}

// An emulated node died whole: it starts again, empty, as a replacement machine would, and
// its braid-run joins the job's next generation (rendezvous.hpp).
void Job::replace_node(Rank& node, int status) {
  ++replaced_nodes_;
  report(
      fmt::format("node {} (pid {}) was killed by signal {} ({}); starting it again "
                  "(replacement {} of --max-restarts {})",
                  node.rank, node.pid, WTERMSIG(status), signal_name(WTERMSIG(status)),
                  replaced_nodes_, options_.max_restarts));
  const NodeCommand command = node_braid_run(self_, node.rank);
  node.pid = emulation_->start_node(node.rank, command.argv, node_env_, old_mask_);
  node.running = true;
}

int Job::run() {
  if (options_.emulate_nodes > 0) return start_emulated_nodes();
  for (const char* name : kRankVariables) config::knob(name);
  if (options_.nnodes > 1) speaker() = fmt::format("braid-run (node {})", options_.node_rank);

  std::string host = options_.master_addr.empty() ? "127.0.0.1" : options_.master_addr;
  // On one node, any free port: braid-run binds it itself (Rendezvous::port()).
  std::uint16_t port = options_.master_port           ? *options_.master_port
                       : options_.master_addr.empty() ? 0
                                                      : transport::kDefaultStorePort;
  std::string token = config::string_value("BRAID_TOKEN");
  if (token.empty() && options_.nnodes > 1) {
    report(
        "BRAID_TOKEN is not set, so the store will accept any client; set it to the same "
        "secret on every node");
  } else if (token.empty()) {
    token = random_token();
  }

  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    auto name = entry.substr(0, entry.find('='));
    if (std::find(kRankVariables.begin(), kRankVariables.end(), name) == kRankVariables.end() &&
        std::find(kTorchVariables.begin(), kTorchVariables.end(), name) == kTorchVariables.end()) {
      shared_env_.emplace_back(entry);
    }
  }
  // The world's size and this node's place in it are each generation's (rank_environment).
  shared_env_.push_back(fmt::format("BRAID_LOCAL_WORLD_SIZE={}", options_.nproc_per_node));
  if (!options_.master_addr.empty() && port == 65535) {
    throw std::invalid_argument(
        "--master-port 65535 leaves no port after it for PyTorch's store (MASTER_PORT)");
  }
  shared_env_.push_back(fmt::format("LOCAL_WORLD_SIZE={}", options_.nproc_per_node));
  shared_env_.push_back(fmt::format("MASTER_ADDR={}", host));
  // Several ranks each starting an OpenMP (libtorch) and a BLAS (OpenBLAS) pool as wide
  // as the machine would run cores x ranks threads: one each unless the user said.
  if (options_.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    shared_env_.push_back("OMP_NUM_THREADS=1");
  }

  make_snapshot_fds();
  take_signals();
  // After take_signals(): the store's thread must start with SIGCHLD, SIGINT and SIGTERM
  // blocked, so that they reach the signalfd and not it.
  try {
    std::optional<transport::EtcdAddress> etcd =
        transport::parse_etcd_url(options_.store_url, "--store");
    if (!etcd) etcd.emplace();
    rendezvous_.emplace(Rendezvous::Options{
        .host = host,
        .port = port,
        .token = token,
        .serve = options_.node_rank == 0,
        .etcd_members = std::move(etcd->members),
        .etcd_namespace = std::move(etcd->key_namespace),
        .node_rank = options_.node_rank,
        .nnodes = options_.nnodes,
        .min_nnodes = fewest_nodes(),
        .join_wait = std::chrono::duration_cast<std::chrono::milliseconds>(options_.join_wait),
        .max_restarts = options_.max_restarts,
        .interrupt_fd = signal_fd_});
  } catch (const std::runtime_error& e) {
    report(e.what());
    // A signal that ended the wait for node 0 is read here, so that it does not end
    // braid-run unsaid once the signals are unblocked; it makes the exit status.
    int status = 1;
    signalfd_siginfo info{};
    while (::read(signal_fd_, &info, sizeof info) == sizeof info) {
      if (info.ssi_signo != SIGCHLD) status = 128 + static_cast<int>(info.ssi_signo);
    }
    return status;
  }
  port = rendezvous_->port();
  if (options_.store_url.empty()) {
    shared_env_.push_back(fmt::format("BRAID_STORE={}", transport::format_host_port(host, port)));
    shared_env_.push_back("BRAID_STORE_SERVED_BY=launcher");
  } else {
    shared_env_.push_back(fmt::format("BRAID_STORE={}", options_.store_url));
  }
  if (!token.empty()) shared_env_.push_back(fmt::format("BRAID_TOKEN={}", token));
  // PyTorch's store (rank 0's TCPStore under env://) needs a port of its own beside
  // braid's: a free one on one node; on several, the one after braid's store, which every
  // node can compute alike.
  std::uint16_t torch_port = 0;
  if (options_.master_addr.empty()) {
    do torch_port = transport::find_free_port();
    while (torch_port == port);
  } else {
    torch_port = static_cast<std::uint16_t>(port + 1);
  }
  shared_env_.push_back(fmt::format("MASTER_PORT={}", torch_port));
  for (;;) {
    const std::optional<std::int64_t> generation = rendezvous_->enter();
    if (!generation && rendezvous_->not_joined()) {
      report(*rendezvous_->not_joined());
      return 1;
    }
    if (!generation && rendezvous_->found_ended()) {
      report(fmt::format(
          "the job in the store on {} had already ended before this braid-run joined it ({}); "
          "{}",
          rendezvous_->where(), describe(*rendezvous_->ended()),
          options_.store_url.empty() ? "nothing is left to run"
                                     : "give each run a name of its own: etcd://.../<name>"));
      return 1;
    }
    if (!generation) return conclude(*rendezvous_->ended());
    generation_ = *generation;
    const std::vector<int>& members = rendezvous_->members();
    node_index_ = static_cast<int>(std::find(members.begin(), members.end(), options_.node_rank) -
                                   members.begin());
    const bool resized = node_count_ != 0 && node_count_ != static_cast<int>(members.size());
    node_count_ = static_cast<int>(members.size());
    if (fewest_nodes() < options_.nnodes && (resized || generation_ == 0)) {
      report(
          fmt::format("{} {} of --nnodes {}:{} (nodes {}); this node is node {} of them, its "
                      "ranks {} to {}",
                      resized ? "the job now runs on" : "the job runs on", node_count_,
                      fewest_nodes(), options_.nnodes, fmt::join(members, ", "), node_index_,
                      first_rank(), first_rank() + options_.nproc_per_node - 1));
    }
    ranks_.reserve(static_cast<std::size_t>(options_.nproc_per_node));
    for (int i = 0; i < options_.nproc_per_node && !stopping_; ++i) start_rank(i);
    supervise();
    for (Rank& rank : ranks_) drain(rank);
    const GenerationEnd end = end_of_generation();
    if (end.kind != GenerationEnd::Kind::restart) return conclude(end);
    report(fmt::format("restarting {} {} rank(s) ({}){}",
                       options_.nnodes == 1 ? "the job's" : "this node's", options_.nproc_per_node,
                       end.counted
                           ? fmt::format("restart {} of --max-restarts {}",
                                         rendezvous_->restarts_used() + 1, options_.max_restarts)
                           : "to take in a node, not counted against --max-restarts",
                       end.ours ? "" : fmt::format(": {}", end.why)));
    start_again();
  }
}

}  // namespace

int run_job(const LaunchOptions& options) {
  Job job(options);
  return job.run();
}

}  // namespace braid::launcher
