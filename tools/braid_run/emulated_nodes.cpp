#include "emulated_nodes.hpp"

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sched.h>
#include <sstream>
#include <stdexcept>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <system_error>
#include <unistd.h>
#include <utility>

#include <fmt/format.h>

namespace braid::launcher {
namespace {

constexpr const char* kBridge = "braid0";
constexpr int kMaxNodes = 4096;  // addresses stay inside 198.18.0.0/15 with room to spare

std::string switch_port(int node) {
  return fmt::format("n{}", node);
}

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// Runs `argv` (found on PATH) to its end, in the network namespace of process `netns_of`
// when given, and throws std::runtime_error quoting the command when it fails.
void run_command(const std::vector<std::string>& argv, std::optional<pid_t> netns_of = {}) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int netns = -1;
  if (netns_of) {
    netns = ::open(fmt::format("/proc/{}/ns/net", *netns_of).c_str(), O_RDONLY | O_CLOEXEC);
    if (netns < 0) throw_errno(fmt::format("cannot open node process {}'s namespace", *netns_of));
  }
  const pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork");
  if (pid == 0) {
    if (netns >= 0 && ::setns(netns, CLONE_NEWNET) != 0) ::_exit(126);
    ::execvp(args[0], args.data());
    ::_exit(errno == ENOENT ? 127 : 126);
  }
  if (netns >= 0) ::close(netns);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw_errno("waitpid");
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  std::string command;
  for (const std::string& a : argv) command += (command.empty() ? "" : " ") + a;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    throw std::runtime_error(
        fmt::format("'{}' is not installed (Debian: apt-get install {})", argv[0],
                    argv[0] == "ip" || argv[0] == "tc" ? "iproute2" : argv[0]));
  }
  throw std::runtime_error(fmt::format("'{}' failed (status {})", command, status));
}

// What the node's init needs, all of it built before clone(): the child is a copy of this
// single-threaded process and must not allocate while another thread might hold a lock.
struct NodeStart {
  int node = 0;
  int go_fd = -1;  // read end: one byte once the node's link is up; EOF: give up
  std::string hostname;
  const std::string* hosts = nullptr;  // the text of every node's /etc/hosts
  std::vector<char*> argv;
  std::vector<char*> envp;
  std::vector<char*> agent_argv;  // empty: the node serves no launch agent beside argv
  sigset_t blocked_mask{};
};

[[noreturn]] void init_failed(const NodeStart& start, const char* what) {
  const std::string message =
      fmt::format("braid-run: node {}: {}: {}\n", start.node, what, std::strerror(errno));
  ssize_t ignored = ::write(STDERR_FILENO, message.data(), message.size());
  static_cast<void>(ignored);
  ::_exit(125);
}

// The node's first process: PID 1 of its PID namespace. Mounts the node's own /proc, /sys
// (so they show its processes and its network) and /dev/shm, names the node, waits for its
// link, then starts the node's launch agent where it has one and the node's braid-run (or
// program), and stays as the init that reaps orphans.
int node_init(void* arg) {
  const NodeStart& start = *static_cast<const NodeStart*>(arg);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // braid-run gone: so is the node
  ::setpgid(0, 0);
  // Private first, so that nothing mounted here propagates back to the machine.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    init_failed(start, "cannot make its mounts private");
  }
  if (::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    init_failed(start, "cannot mount its /proc");
  }
  if (::mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    init_failed(start, "cannot mount its /sys");
  }
  if (::mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0) {
    init_failed(start, "cannot mount its /dev/shm");
  }
  if (::sethostname(start.hostname.data(), start.hostname.size()) != 0) {
    init_failed(start, "cannot set its hostname");
  }
  // Every node's name resolves, as a cluster's DNS makes it: Slurm's node lists and
  // `braid-run --on-node node1` name nodes, not addresses. The file is written into the
  // node's own /dev/shm, mounted over /etc/hosts and unlinked, so it goes with the node.
  constexpr const char* kHostsFile = "/dev/shm/.braid-hosts";
  const int hosts = ::open(kHostsFile, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (hosts < 0) init_failed(start, "cannot write its /etc/hosts");
  const bool written = ::write(hosts, start.hosts->data(), start.hosts->size()) ==
                       static_cast<ssize_t>(start.hosts->size());
  ::close(hosts);
  if (!written || ::mount(kHostsFile, "/etc/hosts", nullptr, MS_BIND, nullptr) != 0) {
    init_failed(start, "cannot mount its /etc/hosts");
  }
  ::unlink(kHostsFile);
  char go = 0;
  ssize_t n;
  while ((n = ::read(start.go_fd, &go, 1)) < 0 && errno == EINTR) {
  }
  if (n != 1) ::_exit(125);  // braid-run could not make the link and says why
  ::close(start.go_fd);

  pid_t agent = -1;
  if (!start.agent_argv.empty()) {
    agent = ::fork();
    if (agent < 0) init_failed(start, "cannot fork");
    if (agent == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::sigprocmask(SIG_SETMASK, &start.blocked_mask, nullptr);
      ::execve(start.agent_argv[0], start.agent_argv.data(), start.envp.data());
      init_failed(start, "cannot execute its launch agent");
    }
  }
  const pid_t launcher = ::fork();
  if (launcher < 0) init_failed(start, "cannot fork");
  if (launcher == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::sigprocmask(SIG_SETMASK, &start.blocked_mask, nullptr);
    ::execve(start.argv[0], start.argv.data(), start.envp.data());
    init_failed(start, "cannot execute braid-run");
  }
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid == launcher) {
      ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
    if (pid == agent && WIFEXITED(status)) {
      // It failed on its own (a signal is the node being stopped): the program goes on,
      // but nothing reaches this node through the agent any more.
      const int code = WEXITSTATUS(status);
      std::array<char, 160> line{};
      const int n = std::snprintf(line.data(), line.size(),
                                  "braid-run: node %d: its launch agent ended (status %d)\n",
                                  start.node, code);
      ssize_t ignored = ::write(STDERR_FILENO, line.data(), static_cast<std::size_t>(n));
      static_cast<void>(ignored);
    }
    if (pid < 0 && errno != EINTR) ::_exit(125);
  }
}

}  // namespace

std::string EmulatedNodes::address_of(int node) {
  const std::uint32_t host = static_cast<std::uint32_t>(node) + 1;  // inside 198.18.0.0/15
  return fmt::format("198.{}.{}.{}", 18 + (host >> 16), (host >> 8) & 0xff, host & 0xff);
}

EmulatedNodes::EmulatedNodes(int nodes, std::optional<LinkRate> rate)
    : nodes_(nodes), rate_(std::move(rate)), node_netns_(static_cast<std::size_t>(nodes), -1) {
  if (nodes < 1 || nodes > kMaxNodes) {
    throw std::invalid_argument(fmt::format("--emulate-nodes {} is not 1 to {}", nodes, kMaxNodes));
  }
  if (::unshare(CLONE_NEWNET) != 0) {
    throw std::runtime_error(fmt::format(
        "--emulate-nodes needs root (CAP_SYS_ADMIN) to make network namespaces: unshare: {}",
        std::strerror(errno)));
  }
  run_command({"ip", "link", "add", kBridge, "type", "bridge"});
  run_command({"ip", "link", "set", kBridge, "up"});
  hosts_ = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";
  for (int node = 0; node < nodes; ++node) {
    hosts_ += fmt::format("{}\t{}\n", address_of(node), node_name(node));
  }
}

EmulatedNodes::~EmulatedNodes() {
  for (int fd : node_netns_) {
    if (fd >= 0) ::close(fd);
  }
}

std::string EmulatedNodes::node_name(int node) {
  return fmt::format("node{}", node);
}

pid_t EmulatedNodes::start_node(int node, const std::vector<std::string>& argv,
                                const std::vector<std::string>& env, const sigset_t& blocked_mask,
                                const std::vector<std::string>& agent_argv) {
  int& held_netns = node_netns_.at(static_cast<std::size_t>(node));
  if (held_netns >= 0) {
    // A node started again: its predecessor's link is deleted (both ends of the veth pair)
    // while its namespace is still held, so the port's name is free at once, and then the
    // namespace goes.
    run_command({"ip", "link", "del", switch_port(node)});
    ::close(std::exchange(held_netns, -1));
  }
  NodeStart start{.node = node, .hostname = node_name(node), .hosts = &hosts_};
  for (const std::string& a : argv) start.argv.push_back(const_cast<char*>(a.c_str()));
  start.argv.push_back(nullptr);
  for (const std::string& a : agent_argv) start.agent_argv.push_back(const_cast<char*>(a.c_str()));
  if (!agent_argv.empty()) start.agent_argv.push_back(nullptr);
  for (const std::string& e : env) start.envp.push_back(const_cast<char*>(e.c_str()));
  start.envp.push_back(nullptr);
  start.blocked_mask = blocked_mask;
  std::array<int, 2> go{};
  if (::pipe2(go.data(), O_CLOEXEC) != 0) throw_errno("pipe2");
  start.go_fd = go[0];

  constexpr std::size_t kStackBytes = std::size_t{256} << 10;
  std::vector<char> stack(kStackBytes);
  const int flags =
      CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNS | SIGCHLD;
  const pid_t pid = ::clone(node_init, stack.data() + stack.size(), flags, &start);
  ::close(go[0]);
  if (pid < 0) {
    ::close(go[1]);
    throw_errno(fmt::format("cannot make node {}'s namespaces (clone)", node));
  }
  ::setpgid(pid, pid);
  const int netns = ::open(fmt::format("/proc/{}/ns/net", pid).c_str(), O_RDONLY | O_CLOEXEC);
  held_netns = netns;
  // Closing `go` unsent (an exception below) tells the init to give up.
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{go[1]};

  const std::string port = switch_port(node);
  const std::string address = fmt::format("{}/15", address_of(node));
  run_command({"ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns",
               std::to_string(pid)});
  run_command({"ip", "link", "set", port, "master", kBridge});
  run_command({"ip", "link", "set", port, "up"});
  run_command({"ip", "link", "set", "lo", "up"}, pid);
  run_command({"ip", "addr", "add", address, "dev", "eth0"}, pid);
  run_command({"ip", "link", "set", "eth0", "up"}, pid);
  if (rate_) {
    // Burst: 1 ms at the rate (at least 64 KiB); queue: 50 ms at the rate, so TCP sees a
    // link of that speed rather than drops.
    const auto burst = static_cast<long long>(std::max(65536.0, rate_->bytes_per_second / 1e3));
    const auto limit = static_cast<long long>(std::max(262144.0, rate_->bytes_per_second / 20));
    const std::vector<std::string> shape{
        "rate", rate_->text, "burst", std::to_string(burst), "limit", std::to_string(limit)};
    for (const bool inside : {false, true}) {
      std::vector<std::string> tc{"tc",   "qdisc", "add", "dev", inside ? "eth0" : port,
                                  "root", "tbf"};
      tc.insert(tc.end(), shape.begin(), shape.end());
      run_command(tc, inside ? std::optional(pid) : std::nullopt);
    }
  }
  const char byte = 1;
  if (::write(go[1], &byte, 1) != 1) throw_errno(fmt::format("cannot start node {}", node));
  return pid;
}

std::vector<std::string> EmulatedNodes::traffic_report() const {
  // /proc/net/dev shows the reader's network namespace: the switch's. A port's received
  // bytes are what its node sent.
  std::ifstream dev("/proc/net/dev");
  std::string line;
  std::vector<std::string> report;
  std::vector<std::pair<long long, long long>> bytes(static_cast<std::size_t>(nodes_), {-1, -1});
  while (std::getline(dev, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name.size() < 2 || name[0] != 'n') continue;
    const int node = std::atoi(name.c_str() + 1);
    if (node < 0 || node >= nodes_ || name != switch_port(node)) continue;
    std::istringstream fields(line.substr(colon + 1));
    std::array<long long, 9> value{};
    for (long long& v : value) fields >> v;
    bytes[static_cast<std::size_t>(node)] = {value[0], value[8]};  // rx bytes, tx bytes
  }
  for (int node = 0; node < nodes_; ++node) {
    const auto [sent, received] = bytes[static_cast<std::size_t>(node)];
    if (sent < 0) continue;
    report.push_back(fmt::format("node {} ({}) sent {} bytes and received {} bytes over its link",
                                 node, address_of(node), sent, received));
  }
  return report;
}

}  // namespace braid::launcher
