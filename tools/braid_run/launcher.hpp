// braid-run's process supervision: start this node's ranks with the BRAID_* environment
// parse_launch_env() reads, relay their output line by line behind a "[rank] " prefix,
// and stop the job as a whole: when one rank fails, when braid-run is told to stop
// (SIGINT/SIGTERM, forwarded to every rank), or when it outlives its timeout.
//
// One thread and one poll() loop: the ranks' pipes and a signalfd for SIGCHLD, SIGINT
// and SIGTERM. Each rank runs in its own process group, so stopping a rank also stops
// what it started (a shell wrapper's child, a data-loader worker), and a Ctrl-C at the
// terminal reaches the ranks once, through braid-run, rather than twice.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "emulated_nodes.hpp"

namespace braid::launcher {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;      // the most nodes (--nnodes N, or MAX of --nnodes MIN:MAX)
  int min_nnodes = 0;  // the fewest (0: nnodes); below nnodes, nodes may come and go
  // --nnodes MIN:MAX: how long a start waits for more nodes once MIN have joined.
  std::chrono::nanoseconds join_wait = std::chrono::seconds(10);
  int node_rank = 0;                         // this node's place among the nnodes (its slot)
  std::string master_addr;                   // empty: 127.0.0.1 (one node only)
  std::optional<std::uint16_t> master_port;  // empty: kDefaultStorePort with --master-addr,
                                             // else a free local port
  std::chrono::nanoseconds grace = std::chrono::seconds(5);  // SIGTERM to SIGKILL
  std::optional<std::chrono::nanoseconds> timeout;           // empty: none
  bool prefix_output = true;
  std::vector<std::string> command;   // the program and its arguments
  int emulate_nodes = 0;              // > 0: run the job on this many emulated nodes
  std::optional<LinkRate> link_rate;  // with emulate_nodes: each link shaped to this rate
  // With emulate_nodes: `command` runs once, on node 0, and every node serves the launch
  // agent (node_agent.hpp) through which it starts processes on the others; the job ends
  // with it.
  bool on_first_node = false;
  // When a rank fails, stop the others and start the job's ranks again, this many times at
  // most (BRAID_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT tell them which start it is).
  int max_restarts = 0;
  // etcd://host:port,.../name: the job's store is that etcd cluster (any node may be lost,
  // node 0 too); empty: node 0's braid-run serves it.
  std::string store_url;
};

// Runs the job to the end (on emulate_nodes emulated nodes, each running a braid-run of
// its own, when set) and returns braid-run's exit status: 0 when every rank exited
// with 0; else the first failure's code (128 + signal for a rank killed by a signal),
// 124 after the timeout, 128 + signal when braid-run itself was told to stop, 127 (or
// 126) when the program cannot be executed. Reports each of these on stderr. Throws
// std::system_error when the supervision itself fails (no pipes, no fork).
int run_job(const LaunchOptions& options);

}  // namespace braid::launcher
