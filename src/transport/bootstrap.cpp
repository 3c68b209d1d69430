#include <algorithm>
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
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/hostlist.hpp>

#include "transport/launch_env.hpp"

namespace braid::transport {
namespace detail {
namespace {

void require_below(const Count& index, const Count& size) {
  if (index.value >= size.value) fail("{} is not below {}", index.shown, size.shown);
}

void require_at_most(const Count& part, const Count& whole) {
  if (part.value > whole.value) fail("{} is larger than {}", part.shown, whole.shown);
}

std::optional<std::string_view> first_present(const EnvReader& reader, const Convention& c) {
  for (std::string_view name : c.names()) {
    if (reader.text(name)) return name;
  }
  return std::nullopt;
}

[[noreturn]] void missing_variable(const EnvReader& reader, const Convention& c,
                                   std::string_view present, std::string_view name) {
  fail("{}={} is set but {} is not (a partial {} environment)", present, *reader.text(present),
       name, c.source);
}

}  // namespace

Count derived(std::string_view what, int value) {
  return {value, fmt::format("{} {} (derived)", what, value), what};
}

std::optional<Count> read_count(const EnvReader& reader, std::string_view name, int minimum) {
  auto text = reader.text(name);
  if (!text) return std::nullopt;
  std::int64_t value = config::parse_int(*text, name);
  if (value < minimum) {
    if (minimum == 0) fail("{}={} must not be negative", name, value);
    fail("{}={} must be at least {}", name, value, minimum);
  }
  if (value > INT_MAX) fail("{}={} is too large", name, value);
  return Count{static_cast<int>(value), fmt::format("{}={}", name, value), {}};
}

Ranks resolve_ranks(const Convention& c, const EnvReader& reader,
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
    if (c.source != "braid" || world->value != 1) {
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
  return {c.source, *rank, *world, *local_rank, *local_world, *node_rank, *nodes};
}

}  // namespace detail

namespace {
using namespace detail;
using config::trim;

constexpr Convention kBraid{"braid",
                            "BRAID_RANK",
                            "BRAID_WORLD_SIZE",
                            "BRAID_LOCAL_RANK",
                            "BRAID_LOCAL_WORLD_SIZE",
                            "BRAID_NODE_RANK",
                            "BRAID_NNODES"};
constexpr Convention kTorchrun{"torchrun",         "RANK",       "WORLD_SIZE",      "LOCAL_RANK",
                               "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"};
// read_openmpi takes the rank from PMIX_RANK where OMPI_COMM_WORLD_RANK is unset.
constexpr Convention kOpenMpi{"openmpi",
                              "OMPI_COMM_WORLD_RANK",
                              "OMPI_COMM_WORLD_SIZE",
                              "OMPI_COMM_WORLD_LOCAL_RANK",
                              "OMPI_COMM_WORLD_LOCAL_SIZE",
                              "",
                              ""};
// Present by SLURM_STEP_NUM_TASKS, which srun alone sets (an sbatch script's own process,
// the batch step, has SLURM_PROCID but no step variables); read_slurm picks the step's
// names or the older ones.
constexpr Convention kSlurmPresence{"slurm", "SLURM_STEP_NUM_TASKS", "", "", "", "", ""};

// "rank 3 of 4 (RANK=3, WORLD_SIZE=4)", "local rank 1 of 2 (LOCAL_WORLD_SIZE=2, local rank
// derived)", "node 0 of 1 (derived)".
std::string pair_text(std::string_view what, const Count& index, const Count& size) {
  std::string from;
  for (const Count* count : {&index, &size}) {
    if (count->derived_as.empty()) {
      from += fmt::format("{}{}", from.empty() ? "" : ", ", count->shown);
    }
  }
  if (from.empty()) {
    from = "derived";
  } else {
    for (const Count* count : {&index, &size}) {
      if (!count->derived_as.empty()) from += fmt::format(", {} derived", count->derived_as);
    }
  }
  return fmt::format("{} {} of {} ({})", what, index.value, size.value, from);
}

bool same_numbers(const Ranks& a, const Ranks& b) {
  return a.rank.value == b.rank.value && a.world.value == b.world.value &&
         a.local_rank.value == b.local_rank.value && a.local_world.value == b.local_world.value &&
         a.node_rank.value == b.node_rank.value && a.nodes.value == b.nodes.value;
}

// An outer launcher that started one process per node (srun --ntasks-per-node 1 braid-run,
// torchrun under srun) agrees with the ranks that process started when it puts them on
// the same node of as many.
bool started_the_node(const Ranks& outer, const Ranks& inner) {
  return outer.local_world.value == 1 && outer.world.value == outer.nodes.value &&
         outer.nodes.value == inner.nodes.value && outer.node_rank.value == inner.node_rank.value;
}

std::string ranks_text(const Ranks& r) {
  return fmt::format("{}, {}, {}", pair_text("rank", r.rank, r.world),
                     pair_text("local rank", r.local_rank, r.local_world),
                     pair_text("node", r.node_rank, r.nodes));
}

Ranks read_braid(const EnvReader& reader) {
  return resolve_ranks(kBraid, reader, std::nullopt);
}

Ranks read_torchrun(const EnvReader& reader) {
  return resolve_ranks(kTorchrun, reader, std::nullopt);
}

Ranks read_openmpi(const EnvReader& reader) {
  Convention c = kOpenMpi;
  auto ompi = read_count(reader, "OMPI_COMM_WORLD_RANK", 0);
  auto pmix = read_count(reader, "PMIX_RANK", 0);
  if (ompi && pmix && ompi->value != pmix->value) {
    fail("{} disagrees with {}: they should name the same process", ompi->shown, pmix->shown);
  }
  if (!ompi && pmix) c.rank = "PMIX_RANK";
  return resolve_ranks(c, reader, std::nullopt);
}

// The launchers in precedence order: the first present is followed.
struct Launcher {
  const Convention& presence;  // any of these set: present
  Ranks (*read)(const EnvReader&);
};
const std::array<Launcher, 4> kLaunchers{{{kBraid, read_braid},
                                          {kTorchrun, read_torchrun},
                                          {kOpenMpi, read_openmpi},
                                          {kSlurmPresence, read_slurm}}};

// Read only to say whether it agrees: never throws.
OutrankedLaunch read_outranked(const Launcher& launcher, const EnvReader& reader,
                               const Ranks& followed) {
  OutrankedLaunch seen{.source = std::string(launcher.presence.source)};
  try {
    const Ranks ranks = launcher.read(reader);
    seen.verdict = same_numbers(ranks, followed) || started_the_node(ranks, followed)
                       ? OutrankedLaunch::Verdict::agrees
                       : OutrankedLaunch::Verdict::disagrees;
    seen.description = ranks_text(ranks);
    if (!same_numbers(ranks, followed) && seen.verdict == OutrankedLaunch::Verdict::agrees) {
      seen.description += " (one per node: it started this node's launcher)";
    }
  } catch (const Error& e) {
    seen.verdict = OutrankedLaunch::Verdict::unreadable;
    seen.description = e.detail();
  }
  return seen;
}

std::uint16_t parse_port(std::string_view text, std::string_view what) {
  std::int64_t port = config::parse_int(text, what);
  if (port < 1 || port > 65535) fail("{}={} is not a port number (1-65535)", what, port);
  return static_cast<std::uint16_t>(port);
}

// torchrun of PyTorch 2.x writes str(True) or str(False).
bool torchrun_agent_store(const EnvReader& reader) {
  auto value = reader.text("TORCHELASTIC_USE_AGENT_STORE");
  if (!value || *value == "False" || *value == "false" || *value == "0") return false;
  if (*value == "True" || *value == "true" || *value == "1") return true;
  fail("TORCHELASTIC_USE_AGENT_STORE='{}' is neither True nor False", *value);
}

std::optional<StoreChoice> master_addr_store(const EnvReader& reader) {
  auto addr = reader.text("MASTER_ADDR");
  auto port_text = reader.text("MASTER_PORT");
  if (addr && !port_text) fail("MASTER_ADDR={} is set but MASTER_PORT is not; set both", *addr);
  if (port_text && !addr) {
    fail("MASTER_PORT={} is set but MASTER_ADDR is not; set both", *port_text);
  }
  if (!addr) return std::nullopt;
  std::string_view host = *addr;
  // torchrun takes IPv6 addresses bare; accept them bracketed too.
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::uint16_t port = parse_port(*port_text, "MASTER_PORT");
  if (!torchrun_agent_store(reader)) {
    return StoreChoice{std::string(host), port, "MASTER_ADDR and MASTER_PORT"};
  }
  if (port == 65535) {
    fail(
        "MASTER_PORT=65535 leaves no port after it for braid's store: under "
        "TORCHELASTIC_USE_AGENT_STORE=True torchrun's own store holds MASTER_PORT and braid's "
        "is at MASTER_PORT + 1");
  }
  return StoreChoice{std::string(host), static_cast<std::uint16_t>(port + 1),
                     fmt::format("MASTER_ADDR, MASTER_PORT={} + 1: torchrun's own store holds "
                                 "MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True)",
                                 port)};
}

StoreChoice resolve_store(const EnvReader& reader, const Ranks& ranks) {
  const bool one_node = ranks.nodes.value == 1;
  // Slurm's ids are checked whatever names the store, as its node lists are: Slurm wrote
  // them, so they hold.
  std::optional<StoreChoice> slurm;
  if (ranks.source == kSlurmPresence.source) slurm = slurm_store(reader, one_node);
  if (auto store = reader.text("BRAID_STORE")) {
    if (std::optional<EtcdAddress> etcd = parse_etcd_url(*store, "BRAID_STORE")) {
      HostPort first = parse_host_port(etcd->members.front(), "BRAID_STORE");
      return {std::move(first.host), first.port, "BRAID_STORE, an etcd cluster", std::move(etcd)};
    }
    HostPort address = parse_host_port(*store, "BRAID_STORE");
    return {std::move(address.host), address.port, "BRAID_STORE"};
  }
  if (auto store = master_addr_store(reader)) return std::move(*store);
  if (ranks.world.value == 1) return {"127.0.0.1", 0, "one rank: any free port"};
  if (slurm) return std::move(*slurm);
  if (!one_node) {
    fail(
        "the {} environment spans {} nodes but names no store: set BRAID_STORE=host:port (or "
        "MASTER_ADDR and MASTER_PORT) to an address of rank 0's node and a free port{}",
        ranks.source, ranks.nodes.value,
        ranks.source == kSlurmPresence.source
            ? " (under srun, SLURM_JOB_ID and SLURM_STEP_NODELIST would place it)"
            : "");
  }
  return {"127.0.0.1", kDefaultStorePort, "every rank on this node, the default port"};
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

std::optional<EtcdAddress> parse_etcd_url(std::string_view text, std::string_view what) {
  constexpr std::string_view kScheme = "etcd://";
  std::string_view t = trim(text);
  if (!t.starts_with(kScheme)) return std::nullopt;
  t.remove_prefix(kScheme.size());
  EtcdAddress address;
  const auto slash = t.find('/');
  std::string_view members = t.substr(0, slash);
  std::string_view name = slash == std::string_view::npos ? "braid" : t.substr(slash + 1);
  while (name.ends_with('/')) name.remove_suffix(1);
  if (name.empty() || name.find_first_of(" \t\n") != std::string_view::npos) {
    fail("{}='{}' names no job after its members: etcd://host:port[,host:port...]/name", what,
         text);
  }
  address.key_namespace = fmt::format("{}/", name);
  for (;;) {
    const auto comma = members.find(',');
    const std::string_view member = members.substr(0, comma);
    if (member.empty()) {
      fail("{}='{}' lists an empty etcd member: etcd://host:port[,host:port...]/name", what, text);
    }
    // Each member as parse_host_port reads it; the error names the whole URL.
    parse_host_port(member, fmt::format("{} (member '{}' of {})", what, member, text));
    address.members.emplace_back(member);
    if (comma == std::string_view::npos) break;
    members.remove_prefix(comma + 1);
  }
  return address;
}

std::string format_etcd_url(const EtcdAddress& address) {
  std::string members;
  for (const std::string& member : address.members) {
    members += fmt::format("{}{}", members.empty() ? "" : ",", member);
  }
  std::string_view name = address.key_namespace;
  if (name.ends_with('/')) name.remove_suffix(1);
  return fmt::format("etcd://{}/{}", members, name);
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

namespace {

// The LaunchInfo of the ranks read, with the store and the description.
void fill_launch(LaunchInfo& info, const EnvReader& reader, const Ranks& ranks) {
  info.rank = ranks.rank.value;
  info.world_size = ranks.world.value;
  info.local_rank = ranks.local_rank.value;
  info.local_world_size = ranks.local_world.value;
  info.node_rank = ranks.node_rank.value;
  info.num_nodes = ranks.nodes.value;
  info.source = std::string(ranks.source);
  StoreChoice store = resolve_store(reader, ranks);
  info.store_host = std::move(store.host);
  info.store_port = store.port;
  info.token = reader.text("BRAID_TOKEN").value_or("");
  info.store_prefix = reader.text("BRAID_STORE_PREFIX").value_or("");
  const std::string served_by = reader.text("BRAID_STORE_SERVED_BY").value_or("rank0");
  if (served_by != "rank0" && served_by != "launcher") {
    fail("BRAID_STORE_SERVED_BY={} is neither rank0 nor launcher", served_by);
  }
  info.store_served_by_launcher = served_by == "launcher";
  std::string where = format_host_port(info.store_host, info.store_port);
  if (store.etcd) {
    where = format_etcd_url(*store.etcd);
    info.etcd_members = std::move(store.etcd->members);
    info.etcd_namespace = std::move(store.etcd->key_namespace);
  }
  info.description =
      fmt::format("{}: {}; store {} ({}{})", info.source, ranks_text(ranks), where, store.origin,
                  info.store_served_by_launcher && !store.etcd ? ", served by the launcher" : "");
}

}  // namespace

LaunchInfo parse_launch_env(const config::EnvLookup& env) {
  EnvReader reader(env);
  LaunchInfo info;
  std::optional<Ranks> followed;
  for (const Launcher& launcher : kLaunchers) {
    if (!first_present(reader, launcher.presence)) continue;
    if (followed) {
      info.outranked.push_back(read_outranked(launcher, reader, *followed));
    } else {
      followed = launcher.read(reader);
    }
  }
  if (!followed) {
    fail(
        "no launcher environment: looked for braid's BRAID_RANK/BRAID_WORLD_SIZE (set by "
        "braid-run), torchrun's RANK/WORLD_SIZE, OpenMPI's OMPI_COMM_WORLD_RANK/"
        "OMPI_COMM_WORLD_SIZE and srun's SLURM_STEP_NUM_TASKS/SLURM_PROCID. Start the job with "
        "braid-run -n N, torchrun, mpirun or srun; a single process can run with "
        "BRAID_WORLD_SIZE=1");
  }
  fill_launch(info, reader, *followed);
  return info;
}

std::optional<LaunchInfo> parse_slurm_step(const config::EnvLookup& env) {
  EnvReader reader(env);
  if (!first_present(reader, kSlurmPresence)) return std::nullopt;
  LaunchInfo info;
  fill_launch(info, reader, read_slurm(reader));
  return info;
}

std::string describe(const LaunchInfo& info) {
  std::string text = info.description;
  for (const OutrankedLaunch& other : info.outranked) {
    constexpr std::array<std::string_view, 3> kVerdicts{
        "also present and agrees", "also present and disagrees", "also present but unreadable"};
    text += fmt::format("; {} {}: {}", other.source,
                        kVerdicts[static_cast<std::size_t>(other.verdict)], other.description);
  }
  if (!info.outranked.empty()) {
    text += "; the first present of braid, torchrun, openmpi, slurm is followed";
  }
  return text;
}

bool outranked_disagree(const LaunchInfo& info) {
  return std::ranges::any_of(info.outranked, [](const OutrankedLaunch& other) {
    return other.verdict != OutrankedLaunch::Verdict::agrees;
  });
}

}  // namespace braid::transport
