// braid-run under another launcher: the flags it was not given, taken from the environment
// that launcher set, so that the same braid-run command line starts a node's ranks under
// Kubernetes and under srun, with no flags for the node's place in the job.
//
//   PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT
//       torchrun's environment form of its flags (PET_<FLAG>), which Kubeflow's TrainJob
//       and PyTorchJob (Training Operator 1.7 on) set on every pod: --nnodes (N, or MIN:MAX),
//       -n (N; "cpu": this machine's cores; "gpu": its GPUs, CUDA_VISIBLE_DEVICES's where
//       set; "auto": the GPUs if there are any, else the cores), --node-rank,
//       --master-addr, --master-port. Where PET_* leaves out the address, MASTER_ADDR and
//       MASTER_PORT (older operators set only these).
//   else, inside a Slurm job step (transport::parse_slurm_step: SLURM_STEP_NUM_TASKS set,
//   which srun alone sets) of one task on this node (srun --ntasks-per-node 1 braid-run
//   ...): the step's number of nodes (--nnodes), this node's index (--node-rank), and the
//   store where the step's rank 0 would serve it (the step's first node, a port from the
//   job and step ids) for --master-addr and --master-port.
//
// A flag on the command line wins over its variable. Malformed or contradictory values
// are usage errors naming the variables.
#pragma once

#include <optional>
#include <string>

#include <braid/core/config.hpp>

#include "launcher.hpp"

namespace braid::launcher {

// Which of the options' fields have been set: by the command line, then by the environment.
struct GivenFlags {
  bool nproc_per_node = false;
  bool nnodes = false;
  bool node_rank = false;
  bool master_addr = false;
  bool master_port = false;
};

// Fills the fields `given` leaves unset from PET_* or Slurm's variables, marking them in
// `given`, and returns a line saying what was read (nullopt when neither convention is
// present). Throws std::invalid_argument, its message naming the variables, for malformed
// values.
std::optional<std::string> apply_launcher_environment(
    LaunchOptions& options, GivenFlags& given,
    const config::EnvLookup& env = config::process_env());

}  // namespace braid::launcher
