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
// Which convention: the first present in this order wins and is read as a whole. The
// others present are read too, only to report whether they agree (LaunchInfo::outranked):
// an error reading one of them is reported, never thrown. What was read and derived, and
// that report, make the line describe() returns, which World::join logs (at info on rank 0,
// as a warning wherever an outranked convention disagrees) and braid-run --print-config
// prints. An outer launcher that started one process per node, which started the ranks
// (srun --ntasks-per-node 1 braid-run, torchrun under srun), agrees when it puts them on
// the same node of as many.
//
//   source      present when any of these is set, and read from them
//   "braid"     BRAID_RANK BRAID_WORLD_SIZE BRAID_LOCAL_RANK BRAID_LOCAL_WORLD_SIZE
//               BRAID_NODE_RANK BRAID_NNODES                      (braid-run, or by hand)
//   "torchrun"  RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK (node rank)
//               GROUP_WORLD_SIZE (number of nodes)
//   "openmpi"   OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK
//               OMPI_COMM_WORLD_LOCAL_SIZE; the rank is PMIX_RANK where
//               OMPI_COMM_WORLD_RANK is unset (both set and different: an error)
//   "slurm"     present when SLURM_STEP_NUM_TASKS is set, which srun alone sets (an
//               salloc shell and an sbatch script's own process have SLURM_PROCID and
//               SLURM_NTASKS but start no step): SLURM_PROCID SLURM_STEP_NUM_TASKS SLURM_LOCALID
//               SLURM_NODEID SLURM_STEP_NUM_NODES SLURM_STEP_TASKS_PER_NODE ("2(x3),1"),
//               where a SLURM_STEP_* is unset its older name (SLURM_NTASKS, SLURM_NNODES,
//               SLURM_TASKS_PER_NODE), and SLURM_NTASKS_PER_NODE where no task list is set
//
// OpenMPI ranks Slurm because mpirun inside a Slurm allocation inherits the allocation's
// SLURM_* variables, which describe the allocation rather than the MPI ranks.
// OMPI_COMM_WORLD_NODE_RANK is not read: despite its name it is the process's index on
// its node across all jobs, not the node's index. PMIX_RANK alone makes no OpenMPI
// environment: srun --mpi=pmix and other PMIx launchers set it too.
//
// Slurm: srun sets SLURM_STEP_NUM_TASKS, SLURM_STEP_NUM_NODES, SLURM_STEP_TASKS_PER_NODE and
// SLURM_STEP_NODELIST for the step it starts, and overwrites SLURM_NTASKS, SLURM_NNODES and
// SLURM_TASKS_PER_NODE with the step's values too -- except under srun --preserve-env (-E),
// which leaves the allocation's there. SLURM_PROCID, SLURM_LOCALID and SLURM_NODEID are
// always the step's. Hence the step's variables first. What Slurm writes twice must agree,
// or the parse fails naming both: the number of nodes with the hosts of the node list
// (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST) and with the entries of the task list;
// the world size with the task list's sum; SLURM_NODEID with the node list's length. The
// task list's run-length groups ("1(x1000000)") and the node list's ranges
// (hostlist.hpp) are counted, never expanded.
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
//   local_world_size  Slurm: the task list's entry for this node, else
//                     SLURM_NTASKS_PER_NODE; else world_size / num_nodes when the number
//                     of nodes is known;
//                     else world_size (one node).
//   local_rank        rank % local_world_size.
//   num_nodes         world_size / local_world_size.
//   node_rank         rank / local_world_size.
//
// Store address and token, for every convention:
//   1. BRAID_STORE=host:port (an IPv6 address in brackets: [::1]:29500), or
//      BRAID_STORE=etcd://host:port[,host:port...][/name]: an etcd cluster's members, any
//      of which may answer, and the namespace of the job's keys there (parse_etcd_url);
//   2. else MASTER_ADDR and MASTER_PORT, both or neither. Under torchrun's agent store
//      (TORCHELASTIC_USE_AGENT_STORE=True, which torchrun of PyTorch 2.x gives its
//      workers; also true, 1; False, false, 0 or unset: no agent store) torchrun's own
//      store already listens at MASTER_PORT on MASTER_ADDR, so braid's is at
//      MASTER_PORT + 1 there: a firewall between nodes must let that port through too.
//      (braid-run does the mirror: PyTorch's store at braid's port + 1.)
//   3. else, with one rank, 127.0.0.1 at port 0 (any free port: no other process needs
//      to find it);
//   4. else, following Slurm's convention with SLURM_JOB_ID set, port
//      kSlurmStorePortBase + a hash of SLURM_JOB_ID and SLURM_STEP_ID % kSlurmStorePorts
//      (20000-29999: below Linux's ephemeral ports, 32768-60999; two jobs or steps running
//      at once on one node meet on one port with odds of 1 in 10000, where BRAID_STORE
//      sets it by hand) on 127.0.0.1 when every rank is on this node,
//      else on the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), where
//      srun's default block distribution starts rank 0 (slurm_store_address);
//   5. else, when every rank is on this node, 127.0.0.1 at kDefaultStorePort;
//   6. else an error asking for BRAID_STORE or MASTER_ADDR/MASTER_PORT.
//   The token is BRAID_TOKEN (empty: the store checks none). Rank 0 serves the store
//   unless BRAID_STORE_SERVED_BY=launcher (braid-run sets it: it serves the store itself),
//   and the ranks' keys lie under BRAID_STORE_PREFIX (empty: none).
//
// Every missing, malformed or contradictory variable throws
// braid::Error(Errc::invalid_environment) whose message names the variable and its value,
// e.g. "RANK='x' is not an integer" or "BRAID_RANK=4 is not below BRAID_WORLD_SIZE=4".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <braid/core/config.hpp>

namespace braid::transport {

// torchrun's default, so a job moved from torchrun finds its firewall holes where they were.
inline constexpr std::uint16_t kDefaultStorePort = 29500;

// The most ranks a job may have: each rank keeps every other rank's UCX address (a few
// hundred bytes) and endpoint, so a world size past this is a typo, not a job.
inline constexpr int kMostRanks = 1 << 20;

// A Slurm job step's store port: kSlurmStorePortBase + a hash of the job and step ids %
// kSlurmStorePorts, the same on every node without a word exchanged (PyTorch Lightning's
// rule takes the job id's last digits).
inline constexpr std::uint16_t kSlurmStorePortBase = 20000;
inline constexpr int kSlurmStorePorts = 10000;

// A convention present in the environment but outranked by the one followed.
struct OutrankedLaunch {
  enum class Verdict { agrees, disagrees, unreadable };
  std::string source;  // "torchrun", "openmpi" or "slurm"
  // agrees: the same six numbers as the convention followed, or one process per node on the
  // same node (the launcher of this node's launcher); unreadable: reading it alone would
  // have failed.
  Verdict verdict = Verdict::unreadable;
  std::string description;  // its numbers, as LaunchInfo::description gives them, or why
                            // they cannot be read
};

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
  // BRAID_STORE=etcd://host:port,.../namespace: the store is that etcd cluster (store_host
  // and store_port name its first member), which outlives every rank and every launcher;
  // the ranks' keys lie under the namespace. Empty: braid's own store.
  std::vector<std::string> etcd_members;
  std::string etcd_namespace;
  // Where braid-run serves the store itself (BRAID_STORE_SERVED_BY=launcher), so the store
  // outlives every rank and a restarted job finds it; else (rank0, the default) rank 0
  // serves it for the job's life.
  bool store_served_by_launcher = false;
  // BRAID_STORE_PREFIX: the namespace of this start's keys in the store (StoreAddress::
  // key_prefix); braid-run gives each generation of a restarting job its own.
  std::string store_prefix;
  std::string source;  // "braid", "torchrun", "openmpi" or "slurm"
  // What was read and derived, on one line: "slurm: rank 3 of 4 (SLURM_PROCID=3,
  // SLURM_STEP_NUM_TASKS=4), local rank 1 of 2 (...), node 1 of 2 (...); store
  // node0:24817 (...)". Empty where the LaunchInfo was not parsed.
  std::string description;
  std::vector<OutrankedLaunch> outranked;  // in precedence order
};

// Throws braid::Error(Errc::invalid_environment); see the rules above.
LaunchInfo parse_launch_env(const config::EnvLookup& env = config::process_env());

// The description, then each outranked convention and whether it agrees, e.g. "...;
// torchrun also present and disagrees: rank 0 of 2 (RANK=0, WORLD_SIZE=2), ...; the first
// present of braid, torchrun, openmpi, slurm is followed".
std::string describe(const LaunchInfo& info);

// Whether a convention the parse outranked disagrees with the one it followed (or could
// not be read): a launcher inside another, or variables left over from one.
bool outranked_disagree(const LaunchInfo& info);

struct HostPort {
  std::string host;  // IPv6 literals without their brackets
  std::uint16_t port = 0;
};

// Where a Slurm job step's rank 0 serves the store (rule 4 above, across nodes): the
// first host of SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST, at the port rule 4 gives.
// nullopt where SLURM_JOB_ID or both node lists are unset; throws
// braid::Error(Errc::invalid_environment) for a malformed one.
std::optional<HostPort> slurm_store_address(const config::EnvLookup& env = config::process_env());

// The Slurm job step this process is a task of, read as parse_launch_env reads Slurm's
// convention (every check, the store by the rules above), whatever else is set; nullopt
// outside a step. braid-run started once per node by srun takes its node from it.
std::optional<LaunchInfo> parse_slurm_step(const config::EnvLookup& env = config::process_env());

// "host:port", "1.2.3.4:port" or "[v6::addr]:port", port 1-65535. `what` names the
// variable or flag in the error (Errc::invalid_environment).
HostPort parse_host_port(std::string_view text, std::string_view what);

// The inverse of parse_host_port: brackets an IPv6 literal.
std::string format_host_port(std::string_view host, std::uint16_t port);

// An etcd cluster as BRAID_STORE names one: "etcd://host:port[,host:port...][/name]".
struct EtcdAddress {
  std::vector<std::string> members;  // "host:port" each, as given
  std::string key_namespace;         // "<name>/"; "braid/" where the URL names none
};
// nullopt where `text` does not start with etcd://; Errc::invalid_environment naming
// `what` for a malformed member list or name.
std::optional<EtcdAddress> parse_etcd_url(std::string_view text, std::string_view what);
// The inverse: the URL every launcher hands its ranks.
std::string format_etcd_url(const EtcdAddress& address);

// A TCP port that was free on every IPv4 interface a moment ago, for a store that will be
// started shortly (braid-run, benchmarks, tests). The port is released before the caller
// binds it, so another process could take it in between: on one machine, seconds apart,
// that is far rarer than a fixed port shared by concurrent jobs colliding. Throws
// braid::Error (system category) if the kernel hands out no port.
std::uint16_t find_free_port();

}  // namespace braid::transport
