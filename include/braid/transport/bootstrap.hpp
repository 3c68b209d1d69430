// Bootstrap: who am I in this job, and where is the rendezvous store? Read from the
// environment a launcher left behind, so a program runs unchanged under braid-run,
// torchrun, mpirun or srun.
//
//   auto launch = braid::transport::parse_launch_env();   // throws braid::Error
//   // launch.rank, launch.world_size, launch.store_host:launch.store_port, ...
//
// Parsing is pure: it reads only through the EnvLookup it is given, so every rule below
// is tested without touching the process environment.
//
// Which convention: the first present in this order wins and is read as a whole; the
// variables of the others are ignored.
//
//   source      present when any of these is set, and read from them
//   "braid"     BRAID_RANK BRAID_WORLD_SIZE BRAID_LOCAL_RANK BRAID_LOCAL_WORLD_SIZE
//               BRAID_NODE_RANK BRAID_NNODES                      (braid-run, or by hand)
//   "torchrun"  RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK (node rank)
//               GROUP_WORLD_SIZE (number of nodes)
//   "openmpi"   OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK
//               OMPI_COMM_WORLD_LOCAL_SIZE
//   "slurm"     SLURM_PROCID (present only when this is set: salloc shells set the
//               others without starting tasks) SLURM_NTASKS SLURM_LOCALID SLURM_NODEID
//               SLURM_NNODES SLURM_TASKS_PER_NODE ("2(x3),1") or SLURM_NTASKS_PER_NODE
//
// OpenMPI ranks Slurm because mpirun inside a Slurm allocation inherits the allocation's
// SLURM_* variables, which describe the allocation rather than the MPI ranks.
// OMPI_COMM_WORLD_NODE_RANK is not read: despite its name it is the process's index on
// its node across all jobs, not the node's index.
//
// An empty value counts as unset. Rank and world size are required; braid alone lets
// BRAID_WORLD_SIZE=1 stand without BRAID_RANK, so a single process needs one variable.
//
// Derived values, when the convention leaves them out. They assume every node runs the
// same number of ranks, placed in blocks (ranks 0..k-1 on the first node, and so on),
// which is what torchrun, braid-run, mpirun's default --map-by slot and srun's default
// block distribution do. Where one process's variables contradict that assumption
// (world size not a multiple of the local world size, a local rank other than
// rank % local world size) the parse fails rather than guess:
//   local_world_size  Slurm: SLURM_TASKS_PER_NODE's entry for this node, else
//                     SLURM_NTASKS_PER_NODE; else world_size / num_nodes when the number
//                     of nodes is known;
//                     else world_size (one node).
//   local_rank        rank % local_world_size.
//   num_nodes         world_size / local_world_size.
//   node_rank         rank / local_world_size.
//
// Store address and token, for every convention:
//   1. BRAID_STORE=host:port (an IPv6 address in brackets: [::1]:29500);
//   2. else MASTER_ADDR and MASTER_PORT, both or neither;
//   3. else, when every rank is on this node, 127.0.0.1 at kDefaultStorePort, or at port
//      0 (any free port: no other process needs to find it) when world_size is 1;
//   4. else an error asking for BRAID_STORE or MASTER_ADDR/MASTER_PORT.
//   The token is BRAID_TOKEN (empty: the store checks none).
//
// Every missing, malformed or contradictory variable throws
// braid::Error(Errc::invalid_environment) whose message names the variable and its value,
// e.g. "RANK='x' is not an integer" or "BRAID_RANK=4 is not below BRAID_WORLD_SIZE=4".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <braid/core/config.hpp>

namespace braid::transport {

// torchrun's default, so a job moved from torchrun finds its firewall holes where they were.
inline constexpr std::uint16_t kDefaultStorePort = 29500;

// The most ranks a job may have: each rank keeps every other rank's UCX address (a few
// hundred bytes) and endpoint, so a world size past this is a typo, not a job.
inline constexpr int kMostRanks = 1 << 20;

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes on this node
  int local_world_size = 1;  // processes on this node
  int node_rank = 0;
  int num_nodes = 1;
  std::string store_host;        // where rank 0 serves the store; a literal, no brackets
  std::uint16_t store_port = 0;  // 0 only when world_size is 1: any free port will do
  std::string token;             // empty: the store accepts any client
  std::string source;            // "braid", "torchrun", "openmpi" or "slurm"
};

// Throws braid::Error(Errc::invalid_environment); see the rules above.
LaunchInfo parse_launch_env(const config::EnvLookup& env = config::process_env());

struct HostPort {
  std::string host;  // IPv6 literals without their brackets
  std::uint16_t port = 0;
};

// "host:port", "1.2.3.4:port" or "[v6::addr]:port", port 1-65535. `what` names the
// variable or flag in the error (Errc::invalid_environment).
HostPort parse_host_port(std::string_view text, std::string_view what);

// The inverse of parse_host_port: brackets an IPv6 literal.
std::string format_host_port(std::string_view host, std::uint16_t port);

// A TCP port that was free on every IPv4 interface a moment ago, for a store that will be
// started shortly (braid-run, benchmarks, tests). The port is released before the caller
// binds it, so another process could take it in between: on one machine, seconds apart,
// that is far rarer than a fixed port shared by concurrent jobs colliding. Throws
// braid::Error (system category) if the kernel hands out no port.
std::uint16_t find_free_port();

}  // namespace braid::transport
