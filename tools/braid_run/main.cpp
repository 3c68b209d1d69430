// braid-run: starts a job's ranks on this node. Command-line parsing lives here; starting
// and supervising the ranks in launcher.cpp.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/transport/bootstrap.hpp>

#include "launch_environment.hpp"
#include "launcher.hpp"
#include "node_agent.hpp"

namespace {

constexpr std::string_view kUsage = R"(usage: braid-run [options] program [args...]
       braid-run --emulate-nodes N --on-first-node [options] program [args...]
       braid-run --on-node HOST command [args...]

Starts N ranks of `program` on this node with BRAID_RANK, BRAID_WORLD_SIZE,
BRAID_LOCAL_RANK, BRAID_LOCAL_WORLD_SIZE, BRAID_NODE_RANK, BRAID_NNODES, BRAID_STORE and
BRAID_TOKEN set, and torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR and MASTER_PORT (PyTorch's env:// store; on several nodes braid's
store port + 1), replacing any inherited values; prefixes each line they print with
"[rank] ", and stops them all when one fails. Ranks read /dev/null as their stdin.

options (options end at the program, or at --):
  -n, --nproc-per-node N  ranks to start on this node (required)
  --nnodes N              nodes in the job (default 1); run braid-run on each of them
  --nnodes MIN:MAX        elastic: at most MAX nodes (--node-rank 0 to MAX-1), and each
                          start of the job runs on those that have joined once all have,
                          or once MIN have and --join-wait has passed; a node lost and not
                          replaced leaves the job smaller at its next start, and a node
                          that comes later restarts it to take part (not counted against
                          --max-restarts). Ranks are numbered over the nodes taking part
  --join-wait SECONDS     with --nnodes MIN:MAX: how long a start waits for more nodes
                          once MIN have joined (default 10)
  --node-rank I           this node's index, 0 to N-1 (default 0); global rank =
                          node rank * nproc-per-node + local rank
  --master-addr HOST      address of node 0, where rank 0 serves the store; needed
                          with --nnodes > 1 (default 127.0.0.1)
  --master-port PORT      the store's port (default 29500 with --master-addr, else a
                          free local port)
  --emulate-nodes N       run the job on N nodes emulated on this machine (needs root):
                          each node its own network, IPC, PID, UTS and mount namespaces,
                          hostname node<i>, address 198.18.0.<i+1> on a bridge; -n ranks
                          on each. Everything it makes goes when braid-run ends, however
                          it ends; the bytes each node sent and received are reported
  --link-rate RATE        with --emulate-nodes: shape each node's link to RATE both ways
                          (tc tbf; e.g. 1gbit, 10gbit)
  --on-first-node         with --emulate-nodes: run the program once, on node 0, with no
                          BRAID_* rank variables, while every node serves a launch agent
                          (see --on-node) for starting processes on the others, as
                          mpirun's ssh launcher does (OMPI_MCA_plm_rsh_agent is set to
                          it); the job ends with the program; -n is not needed
  --on-node HOST          run the rest of the line through /bin/sh on HOST (node<i> or
                          its address), a node of --on-first-node, as `ssh HOST ...`
                          would: its output relayed, its exit status returned
  --grace SECONDS         how long stopping ranks get between SIGTERM and SIGKILL
                          (default 5)
  --timeout SECONDS       stop the job and fail with status 124 if it runs longer
  --max-restarts N        when a rank fails, stop the others and start the job's ranks
                          again, on every node, N times at most in all (default 0);
                          BRAID_RESTART_COUNT (and torchrun's TORCHELASTIC_RESTART_COUNT)
                          says which start it is. A node's braid-run started again (its
                          node replaced) joins the next start. With --emulate-nodes, a
                          node killed whole (its init) is started again too
  --store URL             etcd://host:port[,host:port...]/name: keep the job's store
                          (its rendezvous, restarts and the ranks' keys) in that etcd
                          cluster rather than in node 0's braid-run, so that the job
                          outlives any node, node 0 included; give every node the same
                          URL, and each run a name of its own (default: BRAID_STORE,
                          where it is such a URL)
  --no-prefix             pass the ranks' output through untouched
  --print-config          print what a rank would read from this environment (which
                          launcher's variables, what was derived), the flags braid-run
                          takes from it, and the BRAID_* variables braid reads; exit
  -h, --help              print this help, and exit

Under another launcher, the flags not given come from its variables: torchrun's
PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT
(Kubeflow's PyTorchJob and TrainJob set them; MASTER_ADDR and MASTER_PORT stand in for
the last two), else, in a Slurm job step of one task per node (srun --ntasks-per-node 1
braid-run ...), the step's node count, SLURM_NODEID, and the store on the step's first
node at port 20000 + SLURM_JOB_ID % 10000. A line on stderr says what was taken.

BRAID_TOKEN: passed through when set (set it to the same secret on every node);
otherwise a random token is generated for a single-node job.

OMP_NUM_THREADS: set to 1 for the ranks when there are several on this node and it is
not set already (as torchrun does), so that the ranks' OpenMP and BLAS thread pools do
not overload the cores; set it yourself to give each rank more threads.

SIGINT and SIGTERM are forwarded to every rank; a second one kills them. Exit status:
0 when every rank exits with 0; else the first failing rank's code (128 + signal when
it was killed), 124 after --timeout, 128 + signal when braid-run was stopped, 127/126
when the program cannot be executed, 2 for a usage error.
)";

[[noreturn]] void usage_error(std::string_view message) {
  fmt::print(stderr, "braid-run: {} (braid-run --help for usage)\n", message);
  std::exit(2);
}

int parse_int_flag(std::string_view flag, std::string_view text, int minimum, int maximum) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < minimum ||
      value > maximum) {
    usage_error(
        fmt::format("{} expects an integer from {} to {}, got '{}'", flag, minimum, maximum, text));
  }
  return value;
}

std::chrono::nanoseconds parse_seconds_flag(std::string_view flag, std::string_view text) {
  try {
    return braid::config::parse_seconds(text, flag);
  } catch (const braid::Error& e) {
    usage_error(e.detail());
  }
}

struct Cli {
  braid::launcher::LaunchOptions options;
  braid::launcher::GivenFlags given;
  bool print_config = false;
  std::optional<std::string> environment_line;  // what came from another launcher's variables
  std::string environment_error;                // --print-config: why none could
};

Cli parse_command_line(int argc, char** argv) {
  Cli cli;
  auto& o = cli.options;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program
    // "--flag=value", "--flag value", "-n4", "-n 4"; torchrun's underscores are accepted.
    std::string flag = arg;
    std::optional<std::string> inline_value;
    if (arg.starts_with("--")) {
      if (auto eq = arg.find('='); eq != std::string::npos) {
        flag = arg.substr(0, eq);
        inline_value = arg.substr(eq + 1);
      }
      std::replace(flag.begin(), flag.end(), '_', '-');
    } else if (arg.size() > 2) {
      flag = arg.substr(0, 2);
      inline_value = arg.substr(2);
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) usage_error(fmt::format("{} needs a value", flag));
      return argv[++i];
    };
    auto no_value = [&] {
      if (inline_value) usage_error(fmt::format("{} takes no value", flag));
    };
    if (flag == "-n" || flag == "--nproc-per-node") {
      o.nproc_per_node = parse_int_flag(flag, value(), 1, 1 << 16);
      cli.given.nproc_per_node = true;
    } else if (flag == "--nnodes") {
      const std::string_view text = value();
      const auto colon = text.find(':');
      o.nnodes = parse_int_flag(flag, text.substr(colon == std::string_view::npos ? 0 : colon + 1),
                                1, 1 << 16);
      o.min_nnodes = colon == std::string_view::npos
                         ? o.nnodes
                         : parse_int_flag(flag, text.substr(0, colon), 1, o.nnodes);
      cli.given.nnodes = true;
    } else if (flag == "--join-wait") {
      o.join_wait = parse_seconds_flag(flag, value());
    } else if (flag == "--node-rank") {
      o.node_rank = parse_int_flag(flag, value(), 0, (1 << 16) - 1);
      cli.given.node_rank = true;
    } else if (flag == "--master-addr") {
      o.master_addr = value();
      if (o.master_addr.empty()) usage_error("--master-addr needs a host");
      cli.given.master_addr = true;
    } else if (flag == "--master-port") {
      o.master_port = static_cast<std::uint16_t>(parse_int_flag(flag, value(), 1, 65535));
      cli.given.master_port = true;
    } else if (flag == "--emulate-nodes") {
      o.emulate_nodes = parse_int_flag(flag, value(), 1, 4096);
    } else if (flag == "--link-rate") {
      try {
        o.link_rate = braid::launcher::LinkRate::parse(value());
      } catch (const std::invalid_argument& e) {
        usage_error(e.what());
      }
    } else if (flag == "--on-first-node") {
      no_value();
      o.on_first_node = true;
    } else if (flag == "--grace") {
      o.grace = parse_seconds_flag(flag, value());
    } else if (flag == "--timeout") {
      o.timeout = parse_seconds_flag(flag, value());
      if (*o.timeout == std::chrono::nanoseconds::zero()) usage_error("--timeout must be positive");
    } else if (flag == "--max-restarts") {
      o.max_restarts = parse_int_flag(flag, value(), 0, 1000);
    } else if (flag == "--store") {
      o.store_url = value();
      try {
        if (!braid::transport::parse_etcd_url(o.store_url, "--store")) {
          usage_error(
              fmt::format("--store {} is not etcd://host:port[,host:port...]/name", o.store_url));
        }
      } catch (const braid::Error& e) {
        usage_error(e.detail());
      }
    } else if (flag == "--no-prefix") {
      no_value();
      o.prefix_output = false;
    } else if (flag == "--print-config") {
      no_value();
      cli.print_config = true;
    } else if (flag == "-h" || flag == "--help") {
      no_value();
      fmt::print("{}", kUsage);
      std::exit(0);
    } else {
      usage_error(fmt::format("unknown option '{}'", arg));
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  // Emulated nodes are a job of their own, whatever launcher started braid-run.
  if (o.emulate_nodes == 0) {
    try {
      cli.environment_line = braid::launcher::apply_launcher_environment(o, cli.given);
    } catch (const std::invalid_argument& e) {
      if (!cli.print_config) usage_error(e.what());
      cli.environment_error = e.what();
    }
  }
  if (cli.print_config) return cli;

  // An etcd store named in the environment is the job's, as --store would name it.
  if (const char* inherited = std::getenv("BRAID_STORE");
      o.store_url.empty() && inherited != nullptr &&
      std::string_view(inherited).starts_with("etcd://")) {
    o.store_url = inherited;
    try {
      braid::transport::parse_etcd_url(o.store_url, "BRAID_STORE");
    } catch (const braid::Error& e) {
      usage_error(e.detail());
    }
  }
  if (!o.store_url.empty() && o.on_first_node) {
    usage_error(
        "--store keeps braid-run's rendezvous; --on-first-node starts no ranks to need one");
  }
  if (o.on_first_node && o.emulate_nodes == 0) usage_error("--on-first-node needs --emulate-nodes");
  if (!cli.given.nproc_per_node && !o.on_first_node) {
    usage_error("say how many ranks to start: -n N");
  }
  if (o.command.empty()) usage_error("no program to run");
  if (o.emulate_nodes > 0 && (o.nnodes > 1 || o.node_rank > 0 || !o.master_addr.empty())) {
    usage_error(
        "--emulate-nodes makes the nodes itself: leave out --nnodes, --node-rank and "
        "--master-addr");
  }
  if (o.link_rate && o.emulate_nodes == 0) usage_error("--link-rate needs --emulate-nodes");
  if (o.max_restarts > 0 && o.on_first_node) {
    usage_error("--max-restarts restarts braid-run's ranks; --on-first-node starts none");
  }
  if (static_cast<long long>(o.emulate_nodes) * o.nproc_per_node > INT_MAX) {
    usage_error("--emulate-nodes times --nproc-per-node is too large");
  }
  if (o.node_rank >= o.nnodes) {
    usage_error(fmt::format("--node-rank {} is not below --nnodes {}", o.node_rank, o.nnodes));
  }
  if (o.nnodes > 1 && o.master_addr.empty()) {
    usage_error(
        fmt::format("--nnodes {} needs --master-addr, the address of node 0 where rank "
                    "0 serves the store",
                    o.nnodes));
  }
  if (static_cast<long long>(o.nnodes) * o.nproc_per_node > INT_MAX) {
    usage_error("--nnodes times --nproc-per-node is too large");
  }
  return cli;
}

}  // namespace

int main(int argc, char** argv) {
  // The launch agent's two ends (node_agent.hpp), before the job's options: what follows
  // the host is the remote command line, whatever it looks like.
  if (argc >= 2 && (std::string_view(argv[1]) == "--on-node" ||
                    std::string_view(argv[1]) == "--serve-node-agent")) {
    if (argc < 3) usage_error(fmt::format("{} needs a host", argv[1]));
    const std::string token = braid::config::string_value("BRAID_TOKEN");
    try {
      if (std::string_view(argv[1]) == "--serve-node-agent") {
        braid::launcher::serve_node_agent(argv[2], token);
      }
      if (argc < 4) usage_error("--on-node needs a command to run");
      return braid::launcher::run_on_node(argv[2], std::vector<std::string>(argv + 3, argv + argc),
                                          token);
    } catch (const std::exception& e) {
      fmt::print(stderr, "braid-run: {}\n", e.what());
      return 255;
    }
  }
  Cli cli = parse_command_line(argc, argv);
  if (cli.print_config) {
    // What a rank started here, with this environment, would read, and what braid-run
    // itself took from another launcher's variables.
    try {
      fmt::print("a program started here without braid-run would read: {}\n",
                 braid::transport::describe(braid::transport::parse_launch_env()));
    } catch (const braid::Error& e) {
      fmt::print(
          "a program started here without braid-run would read no launch environment "
          "({})\n",
          e.detail());
    }
    if (cli.environment_line) {
      fmt::print("braid-run takes from the environment: node {} of {}, {} rank(s) each, from {}\n",
                 cli.options.node_rank, cli.options.nnodes, cli.options.nproc_per_node,
                 *cli.environment_line);
    } else if (!cli.environment_error.empty()) {
      fmt::print("braid-run cannot take its flags from the environment: {}\n",
                 cli.environment_error);
    }
    fmt::print("{}", braid::config::describe());
    return 0;
  }
  if (cli.environment_line) {
    fmt::print(stderr, "braid-run: node {} of {}, {} rank(s) each, from {}\n",
               cli.options.node_rank, cli.options.nnodes, cli.options.nproc_per_node,
               *cli.environment_line);
  }
  try {
    return braid::launcher::run_job(cli.options);
  } catch (const std::exception& e) {
    fmt::print(stderr, "braid-run: {}\n", e.what());
    return 1;
  }
}
