#include <arpa/inet.h>
#include <array>
#include <cerrno>
#include <charconv>
#include <climits>
#include <netinet/in.h>
#include <optional>
#include <random>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/transport/bootstrap.hpp>

namespace braid::transport {
namespace {
using config::trim;

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(Errc::invalid_environment, fmt::format(format, std::forward<Args>(args)...));
}

// What one launcher calls each quantity; empty: it has no such variable.
struct Convention {
  std::string_view source;
  std::string_view rank, world_size, local_rank, local_world_size, node_rank, num_nodes;

  std::array<std::string_view, 6> names() const {
    return {rank, world_size, local_rank, local_world_size, node_rank, num_nodes};
  }
};

constexpr Convention kBraid{"braid",
                            "BRAID_RANK",
                            "BRAID_WORLD_SIZE",
                            "BRAID_LOCAL_RANK",
                            "BRAID_LOCAL_WORLD_SIZE",
                            "BRAID_NODE_RANK",
                            "BRAID_NNODES"};
constexpr Convention kTorchrun{"torchrun",         "RANK",       "WORLD_SIZE",      "LOCAL_RANK",
                               "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"};
constexpr Convention kOpenMpi{"openmpi",
                              "OMPI_COMM_WORLD_RANK",
                              "OMPI_COMM_WORLD_SIZE",
                              "OMPI_COMM_WORLD_LOCAL_RANK",
                              "OMPI_COMM_WORLD_LOCAL_SIZE",
                              "",
                              ""};
// The local world size comes from SLURM_TASKS_PER_NODE, which needs its own parser.
constexpr Convention kSlurm{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                            "",      "SLURM_NODEID", "SLURM_NNODES"};

// Reads one variable, empty counting as unset. BRAID_* goes through the knob table, so a
// knob missing from it is caught on first use.
class Reader {
 public:
  explicit Reader(const config::EnvLookup& env) : env_(env) {}

  std::optional<std::string> text(std::string_view name) const {
    if (name.empty()) return std::nullopt;
    std::string value = name.starts_with("BRAID_") ? config::string_value(name, env_)
                                                   : std::string(trim(env_(name).value_or("")));
    if (value.empty()) return std::nullopt;
    return value;
  }

 private:
  const config::EnvLookup& env_;
};

// A quantity and how to name it in a message: "RANK=3", or "local world size 2 (derived)".
struct Count {
  int value = 0;
  std::string shown;
};

Count derived(std::string_view what, int value) {
  return {value, fmt::format("{} {} (derived)", what, value)};
}

std::optional<Count> read_count(const Reader& reader, std::string_view name, int minimum) {
  auto text = reader.text(name);
  if (!text) return std::nullopt;
  std::int64_t value = config::parse_int(*text, name);
  if (value < minimum) {
    if (minimum == 0) fail("{}={} must not be negative", name, value);
    fail("{}={} must be at least {}", name, value, minimum);
  }
  if (value > INT_MAX) fail("{}={} is too large", name, value);
  return Count{static_cast<int>(value), fmt::format("{}={}", name, value)};
}

void require_below(const Count& index, const Count& size) {
  if (index.value >= size.value) fail("{} is not below {}", index.shown, size.shown);
}

void require_at_most(const Count& part, const Count& whole) {
  if (part.value > whole.value) fail("{} is larger than {}", part.shown, whole.shown);
}

[[noreturn]] void bad_task_list(std::string_view list) {
  fail("SLURM_TASKS_PER_NODE='{}' is not a Slurm task count list such as 4(x2),3", list);
}

int parse_task_count(const char*& p, const char* end, std::string_view list) {
  int value = 0;
  auto [next, ec] = std::from_chars(p, end, value);
  if (ec != std::errc() || value < 1) bad_task_list(list);
  p = next;
  return value;
}

// Slurm writes per-node task counts run-length encoded: "4(x2),3" is 4, 4, 3. The
// groups are walked, never expanded, so "1(x1000000000)" costs nothing.
std::optional<Count> slurm_local_world_size(const Reader& reader) {
  auto list = reader.text("SLURM_TASKS_PER_NODE");
  if (!list) return read_count(reader, "SLURM_NTASKS_PER_NODE", 1);
  auto node = read_count(reader, "SLURM_NODEID", 0);
  const char* p = list->data();
  const char* end = p + list->size();
  std::int64_t nodes_before = 0;  // nodes covered by the groups already read
  std::optional<int> previous;
  bool varies = false;
  std::optional<Count> found;  // this node's entry; the rest is still checked
  while (true) {
    int tasks = parse_task_count(p, end, *list);
    int repeat = 1;
    if (p != end && *p == '(') {
      if (end - p < 2 || p[1] != 'x') bad_task_list(*list);
      p += 2;
      repeat = parse_task_count(p, end, *list);
      if (p == end || *p != ')') bad_task_list(*list);
      ++p;
    }
    if (node && !found && node->value < nodes_before + repeat) {
      found = Count{tasks, fmt::format("the {} task(s) SLURM_TASKS_PER_NODE='{}' gives node {}",
                                       tasks, *list, node->value)};
    }
    varies = varies || (previous && *previous != tasks);
    previous = tasks;
    nodes_before += repeat;
    if (p == end) break;
    if (*p != ',') bad_task_list(*list);
    ++p;
  }
  if (found) return found;
  if (node) {
    fail("SLURM_NODEID={} is beyond the {} node(s) in SLURM_TASKS_PER_NODE='{}'", node->value,
         nodes_before, *list);
  }
  if (varies) {
    fail("SLURM_TASKS_PER_NODE='{}' differs between nodes but SLURM_NODEID is not set", *list);
  }
  return Count{*previous, fmt::format("SLURM_TASKS_PER_NODE='{}'", *list)};
}

std::optional<std::string_view> first_present(const Reader& reader, const Convention& c) {
  for (std::string_view name : c.names()) {
    if (reader.text(name)) return name;
  }
  return std::nullopt;
}

[[noreturn]] void missing_variable(const Reader& reader, const Convention& c,
                                   std::string_view present, std::string_view name) {
  fail("{}={} is set but {} is not (a partial {} environment)", present, *reader.text(present),
       name, c.source);
}

LaunchInfo resolve_ranks(const Convention& c, const Reader& reader,
                         std::optional<Count> local_world) {
  auto present = *first_present(reader, c);
  auto world = read_count(reader, c.world_size, 1);
  if (!world) missing_variable(reader, c, present, c.world_size);
  if (world->value > kMostRanks) {
    fail(
        "{} is more ranks than a braid job may have ({}): every rank holds a UCX address for "
        "each of the others",
        world->shown, kMostRanks);
  }
  auto rank = read_count(reader, c.rank, 0);
  if (!rank) {
    // A single process should need one variable, not a launcher.
    if (c.source != kBraid.source || world->value != 1) {
      missing_variable(reader, c, present, c.rank);
    }
    rank = derived("rank", 0);
  }
  require_below(*rank, *world);

  auto local_rank = read_count(reader, c.local_rank, 0);
  if (!local_world) local_world = read_count(reader, c.local_world_size, 1);
  auto node_rank = read_count(reader, c.node_rank, 0);
  auto nodes = read_count(reader, c.num_nodes, 1);
  if (nodes) require_at_most(*nodes, *world);
  if (local_world) require_at_most(*local_world, *world);

  // Where the convention has no variable for it, tell the user how to get out of a
  // layout the derivations cannot see.
  auto set_hint = [&](std::string_view name) {
    if (!name.empty()) return fmt::format("set {}", name);
    return std::string(
        "start the same number of ranks on every node, placed in blocks, or set the BRAID_* "
        "variables");
  };
  if (!local_world) {
    if (nodes && world->value % nodes->value != 0) {
      fail("cannot derive the local world size: {} is not a multiple of {}; {}", world->shown,
           nodes->shown, set_hint(c.local_world_size));
    }
    local_world = derived("local world size", nodes ? world->value / nodes->value : world->value);
  }
  if (local_rank) {
    require_below(*local_rank, *local_world);
  } else {
    local_rank = derived("local rank", rank->value % local_world->value);
  }
  if (!nodes || !node_rank) {
    if (world->value % local_world->value != 0) {
      fail(
          "cannot derive the {}: {} is not a multiple of {}, so nodes run different numbers of "
          "ranks; {}",
          nodes ? "node rank" : "number of nodes", world->shown, local_world->shown,
          set_hint(nodes ? c.node_rank : c.num_nodes));
    }
    if (!nodes) nodes = derived("number of nodes", world->value / local_world->value);
  }
  if (!node_rank) {
    if (local_rank->value != rank->value % local_world->value) {
      fail(
          "cannot derive the node rank: {} with {} and {} means ranks are not placed in blocks "
          "of {} per node; {}",
          rank->shown, local_rank->shown, local_world->shown, local_world->value,
          set_hint(c.node_rank));
    }
    node_rank = derived("node rank", rank->value / local_world->value);
  }
  require_below(*node_rank, *nodes);

  LaunchInfo info;
  info.rank = rank->value;
  info.world_size = world->value;
  info.local_rank = local_rank->value;
  info.local_world_size = local_world->value;
  info.node_rank = node_rank->value;
  info.num_nodes = nodes->value;
  info.source = std::string(c.source);
  return info;
}

std::uint16_t parse_port(std::string_view text, std::string_view what) {
  std::int64_t port = config::parse_int(text, what);
  if (port < 1 || port > 65535) fail("{}={} is not a port number (1-65535)", what, port);
  return static_cast<std::uint16_t>(port);
}

void resolve_store(const Reader& reader, LaunchInfo& info) {
  if (auto store = reader.text("BRAID_STORE")) {
    HostPort address = parse_host_port(*store, "BRAID_STORE");
    info.store_host = std::move(address.host);
    info.store_port = address.port;
    return;
  }
  auto addr = reader.text("MASTER_ADDR");
  auto port = reader.text("MASTER_PORT");
  if (addr && port) {
    std::string_view host = *addr;
    // torchrun takes IPv6 addresses bare; accept them bracketed too.
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    info.store_host = std::string(host);
    info.store_port = parse_port(*port, "MASTER_PORT");
    return;
  }
  if (addr) fail("MASTER_ADDR={} is set but MASTER_PORT is not; set both", *addr);
  if (port) fail("MASTER_PORT={} is set but MASTER_ADDR is not; set both", *port);
  if (info.num_nodes != 1) {
    fail(
        "the {} environment spans {} nodes but names no store: set BRAID_STORE=host:port (or "
        "MASTER_ADDR and MASTER_PORT) to an address of rank 0's node and a free port",
        info.source, info.num_nodes);
  }
  info.store_host = "127.0.0.1";
  info.store_port = info.world_size == 1 ? 0 : kDefaultStorePort;
}

}  // namespace

HostPort parse_host_port(std::string_view text, std::string_view what) {
  std::string_view t = trim(text);
  std::string_view host, port;
  if (t.starts_with('[')) {
    auto close = t.find(']');
    if (close == std::string_view::npos || close == 1 || t.substr(close + 1, 1) != ":") {
      fail("{}='{}' must be [address]:port", what, text);
    }
    host = t.substr(1, close - 1);
    port = t.substr(close + 2);
  } else {
    auto colon = t.rfind(':');
    if (colon == std::string_view::npos || colon == 0) {
      fail("{}='{}' must be host:port", what, text);
    }
    host = t.substr(0, colon);
    port = t.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      fail("{}='{}' must be host:port; write an IPv6 address in brackets, as in [::1]:29500", what,
           text);
    }
  }
  int value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value < 1 ||
      value > 65535) {
    fail("{}='{}' has port '{}', not a port number (1-65535)", what, text, port);
  }
  return {std::string(host), static_cast<std::uint16_t>(value)};
}

std::string format_host_port(std::string_view host, std::uint16_t port) {
  if (host.find(':') != std::string_view::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

namespace {

// Whether `port` (0: any) can be bound on every IPv4 interface now; the port bound, or 0.
std::uint16_t try_bind(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw Error(std::error_code(errno, std::system_category()), "socket()",
                {.operation = "find_free_port"});
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);  // where StoreServer listens by default
  address.sin_port = htons(port);
  socklen_t length = sizeof address;
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0 &&
                     ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int saved = errno;
  ::close(fd);
  if (!bound && port == 0) {
    throw Error(std::error_code(saved, std::system_category()), "binding port 0",
                {.operation = "find_free_port"});
  }
  return bound ? ntohs(address.sin_port) : 0;
}

}  // namespace

// The port is free when checked and taken later (by the store, in another process), so
// another program could take it in between. Ports the kernel hands out -- bind(0), and
// the source ports of outgoing connections -- come from the ephemeral range (Linux:
// 32768-60999), where that race is likeliest: two launchers asking bind(0) at once, or a
// client's connection, can land on the port just probed. So pick at random below that
// range first, and fall back to bind(0) only if 64 tries find nothing free.
std::uint16_t find_free_port() {
  constexpr std::uint16_t kLowest = 20000;
  constexpr std::uint16_t kHighest = 32767;
  static thread_local std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> pick(kLowest, kHighest);
  for (int attempt = 0; attempt < 64; ++attempt) {
    if (const std::uint16_t port = try_bind(static_cast<std::uint16_t>(pick(random)))) return port;
  }
  return try_bind(0);
}

LaunchInfo parse_launch_env(const config::EnvLookup& env) {
  Reader reader(env);
  LaunchInfo info;
  if (first_present(reader, kBraid)) {
    info = resolve_ranks(kBraid, reader, std::nullopt);
  } else if (first_present(reader, kTorchrun)) {
    info = resolve_ranks(kTorchrun, reader, std::nullopt);
  } else if (first_present(reader, kOpenMpi)) {
    info = resolve_ranks(kOpenMpi, reader, std::nullopt);
  } else if (reader.text(kSlurm.rank)) {
    info = resolve_ranks(kSlurm, reader, slurm_local_world_size(reader));
  } else {
    fail(
        "no launcher environment: looked for braid's BRAID_RANK/BRAID_WORLD_SIZE (set by "
        "braid-run), torchrun's RANK/WORLD_SIZE, OpenMPI's OMPI_COMM_WORLD_RANK/"
        "OMPI_COMM_WORLD_SIZE and Slurm's SLURM_PROCID/SLURM_NTASKS. Start the job with "
        "braid-run -n N, torchrun, mpirun or srun; a single process can run with "
        "BRAID_WORLD_SIZE=1");
  }
  resolve_store(reader, info);
  info.token = config::string_value("BRAID_TOKEN", env);
  return info;
}

}  // namespace braid::transport
