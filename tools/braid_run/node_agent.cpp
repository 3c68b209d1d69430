#include "node_agent.hpp"

#include <arpa/inet.h>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <optional>
#include <poll.h>
#include <string_view>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <system_error>
#include <unistd.h>

#include <fmt/format.h>

#include "emulated_nodes.hpp"

namespace braid::launcher {
namespace {

enum class Frame : std::uint8_t { out = 1, err = 2, exit_status = 3 };

constexpr std::uint32_t kMostRequestBytes = 1 << 20;
constexpr auto kAgentStartWait = std::chrono::seconds(10);
constexpr int kStopGraceMs = 5000;

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

bool write_all(int fd, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, std::size_t size) {
  auto* bytes = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

bool send_frame(int socket, Frame type, std::string_view data) {
  std::array<char, 5> head{};
  head[0] = static_cast<char>(type);
  const std::uint32_t length = htonl(static_cast<std::uint32_t>(data.size()));
  std::memcpy(head.data() + 1, &length, sizeof length);
  return write_all(socket, head.data(), head.size()) && write_all(socket, data.data(), data.size());
}

bool send_status(int socket, int status) {
  const std::uint32_t code = htonl(static_cast<std::uint32_t>(status));
  return send_frame(socket, Frame::exit_status,
                    std::string_view(reinterpret_cast<const char*>(&code), sizeof code));
}

int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The caller left: the command's process group gets SIGTERM, then, once the group is still
// there after the grace or its first process is gone, SIGKILL for whatever is left of it.
void stop_command(pid_t child, bool reaped) {
  ::kill(-child, SIGTERM);
  for (int waited = 0; waited < kStopGraceMs && ::kill(-child, 0) == 0; waited += 50) {
    if (!reaped && ::waitpid(child, nullptr, WNOHANG) == child) reaped = true;
    ::usleep(50'000);
  }
  ::kill(-child, SIGKILL);
  if (!reaped) ::waitpid(child, nullptr, 0);
}

// One caller, in a process of its own: check its token, run its command, relay.
int serve_caller(int socket, const std::string& token) {
  std::uint32_t length = 0;
  if (!read_all(socket, &length, sizeof length)) return 1;
  length = ntohl(length);
  if (length > kMostRequestBytes) return 1;
  std::string request(length, '\0');
  if (!read_all(socket, request.data(), request.size())) return 1;
  // token NUL cwd NUL command NUL
  std::array<std::string, 3> fields;
  std::size_t at = 0;
  for (std::string& field : fields) {
    const std::size_t end = request.find('\0', at);
    if (end == std::string::npos) return 1;
    field = request.substr(at, end - at);
    at = end + 1;
  }
  const auto& [their_token, directory, command] = fields;
  if (their_token != token) {
    send_frame(socket, Frame::err, "braid-run --on-node: the agent refused a wrong BRAID_TOKEN\n");
    send_status(socket, 255);
    return 1;
  }

  std::array<int, 2> out{-1, -1}, err{-1, -1};
  if (::pipe2(out.data(), O_CLOEXEC) != 0 || ::pipe2(err.data(), O_CLOEXEC) != 0) return 1;
  const pid_t child = ::fork();
  if (child < 0) return 1;
  if (child == 0) {
    ::setpgid(0, 0);
    ::signal(SIGPIPE, SIG_DFL);
    const int null = ::open("/dev/null", O_RDONLY);
    ::dup2(null, STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    if (::chdir(directory.c_str()) != 0 && ::chdir("/") != 0) ::_exit(126);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(child, child);  // as the child does: the group exists whichever runs first
  ::close(out[1]);
  ::close(err[1]);
  // The child's exit, as an fd to poll beside its output and the caller.
  const int exited = static_cast<int>(::syscall(SYS_pidfd_open, child, 0));

  std::array<pollfd, 4> fds{pollfd{out[0], POLLIN, 0}, pollfd{err[0], POLLIN, 0},
                            pollfd{socket, POLLIN, 0}, pollfd{exited, POLLIN, 0}};
  std::array<char, 65536> buffer{};
  std::optional<int> status;
  // Until the command has exited and its output has closed, however it closes its output.
  while (fds[0].fd >= 0 || fds[1].fd >= 0 || !status) {
    if (::poll(fds.data(), fds.size(), exited < 0 && !status ? 100 : -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    // The caller sends nothing after its request: readable means it went away.
    if (fds[2].revents != 0) {
      stop_command(child, status.has_value());
      return 0;
    }
    if (!status) {
      int raw = 0;
      if (::waitpid(child, &raw, WNOHANG) == child) {
        status = exit_code_of(raw);
        fds[3].fd = -1;
      }
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer.data(), buffer.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        continue;
      }
      if (!send_frame(socket, i == 0 ? Frame::out : Frame::err,
                      std::string_view(buffer.data(), static_cast<std::size_t>(n)))) {
        stop_command(child, status.has_value());
        return 0;
      }
    }
  }
  if (!status) {
    int raw = 0;
    while (::waitpid(child, &raw, 0) < 0 && errno == EINTR) {
    }
    status = exit_code_of(raw);
  }
  send_status(socket, *status);
  return 0;
}

// "node<i>" names node i; anything else must be an IPv4 address.
std::string address_of_host(const std::string& host) {
  if (host.starts_with("node")) {
    int node = -1;
    const char* digits = host.data() + 4;
    const auto [end, error] = std::from_chars(digits, host.data() + host.size(), node);
    if (error == std::errc{} && end == host.data() + host.size() && node >= 0) {
      return EmulatedNodes::address_of(node);
    }
  }
  return host;
}

}  // namespace

void serve_node_agent(const std::string& address, const std::string& token) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) throw_errno("node agent: socket");
  const int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in where{};
  where.sin_family = AF_INET;
  where.sin_port = htons(kNodeAgentPort);
  if (::inet_pton(AF_INET, address.c_str(), &where.sin_addr) != 1) {
    throw std::system_error(EINVAL, std::generic_category(),
                            fmt::format("node agent: '{}' is not an IPv4 address", address));
  }
  if (::bind(listener, reinterpret_cast<const sockaddr*>(&where), sizeof where) != 0) {
    throw_errno(fmt::format("node agent: cannot listen on {}:{}", address, kNodeAgentPort));
  }
  if (::listen(listener, 64) != 0) throw_errno("node agent: listen");
  ::signal(SIGCHLD, SIG_IGN);  // callers' processes reap themselves
  ::signal(SIGPIPE, SIG_IGN);
  for (;;) {
    const int socket = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (socket < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      throw_errno("node agent: accept");
    }
    const pid_t handler = ::fork();
    if (handler == 0) {
      ::close(listener);
      ::signal(SIGCHLD, SIG_DFL);  // the handler waits for its command
      ::_exit(serve_caller(socket, token));
    }
    ::close(socket);
  }
}

int run_on_node(const std::string& host, const std::vector<std::string>& command,
                const std::string& token) {
  auto fail = [&](const std::string& why) {
    fmt::print(stderr, "braid-run --on-node {}: {}\n", host, why);
    return 255;
  };
  const std::string address = address_of_host(host);
  sockaddr_in where{};
  where.sin_family = AF_INET;
  where.sin_port = htons(kNodeAgentPort);
  if (::inet_pton(AF_INET, address.c_str(), &where.sin_addr) != 1) {
    return fail("not a node (node<i>) or an IPv4 address");
  }
  // The nodes start one after another, node 0's program first: an agent not yet
  // listening is waited for, a while.
  int socket = -1;
  const auto give_up = std::chrono::steady_clock::now() + kAgentStartWait;
  for (;;) {
    socket = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (socket < 0) return fail(std::strerror(errno));
    if (::connect(socket, reinterpret_cast<const sockaddr*>(&where), sizeof where) == 0) break;
    const int error = errno;
    ::close(socket);
    const bool starting = error == ECONNREFUSED || error == ENETUNREACH || error == EHOSTUNREACH;
    if (!starting || std::chrono::steady_clock::now() >= give_up) {
      return fail(
          fmt::format("no node agent at {}:{} ({}); is this a node of braid-run "
                      "--emulate-nodes --on-first-node?",
                      address, kNodeAgentPort, std::strerror(error)));
    }
    ::usleep(20'000);
  }
  const int one = 1;
  ::setsockopt(socket, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

  std::string line;
  for (const std::string& word : command) line += (line.empty() ? "" : " ") + word;
  std::array<char, 4096> cwd{};
  if (::getcwd(cwd.data(), cwd.size()) == nullptr) cwd[0] = '\0';
  std::string request = token;
  request.push_back('\0');
  request += cwd.data();
  request.push_back('\0');
  request += line;
  request.push_back('\0');
  const std::uint32_t length = htonl(static_cast<std::uint32_t>(request.size()));
  ::signal(SIGPIPE, SIG_IGN);
  if (!write_all(socket, &length, sizeof length) ||
      !write_all(socket, request.data(), request.size())) {
    return fail("the node agent closed the connection");
  }
  std::string data;
  for (;;) {
    std::array<char, 5> head{};
    if (!read_all(socket, head.data(), head.size())) {
      return fail("the node agent went away before the command ended");
    }
    std::uint32_t size = 0;
    std::memcpy(&size, head.data() + 1, sizeof size);
    data.resize(ntohl(size));
    if (!read_all(socket, data.data(), data.size())) {
      return fail("the node agent went away before the command ended");
    }
    switch (static_cast<Frame>(head[0])) {
      case Frame::out:
        write_all(STDOUT_FILENO, data.data(), data.size());
        break;
      case Frame::err:
        write_all(STDERR_FILENO, data.data(), data.size());
        break;
      case Frame::exit_status: {
        std::uint32_t status = 0;
        if (data.size() != sizeof status) return fail("the node agent sent a malformed status");
        std::memcpy(&status, data.data(), sizeof status);
        ::close(socket);
        return static_cast<int>(ntohl(status));
      }
      default:
        return fail("the node agent sent a frame of an unknown type");
    }
  }
}

}  // namespace braid::launcher
