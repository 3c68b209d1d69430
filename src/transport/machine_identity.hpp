// Which machine a rank runs on, as the kernel sees it, beside the node its launcher says it
// runs on: what lets a World trust its node ranks and keep UCX honest across nodes.
//
// UCX decides by itself that a peer shares its memory: posix and sysv shared memory when
// both run on one kernel (boot id) in one IPC namespace, cross-memory attach (cma) in one
// PID namespace. Nodes emulated on one machine with network namespaces alone, or launchers
// started as pretend nodes on one host, pass those tests, and UCX then moves the bytes
// between "nodes" through memory, never over the network they are meant to test. So ranks
// that their launchers put on different nodes but that could share memory make the World
// keep UCX to its network transports; and ranks put on one node that run on different
// machines (two hosts both given node rank 0) are refused, since braid's own shared-memory
// collectives would fail among them in ways that name nothing.
//
// Cost: one extra round through the store at join, only in jobs of more than one node.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <braid/transport/store/store.hpp>

namespace braid::transport::detail {

struct MachineIdentity {
  std::string hostname;             // for messages: where a node is
  std::string boot_id;              // /proc/sys/kernel/random/boot_id
  std::uint64_t ipc_namespace = 0;  // inode of /proc/self/ns/ipc
  std::uint64_t pid_namespace = 0;  // inode of /proc/self/ns/pid

  static MachineIdentity of_this_process();

  bool same_machine(const MachineIdentity& other) const { return boot_id == other.boot_id; }
  // Whether UCX would find shared memory or cross-memory attach between the two.
  bool shares_memory_with(const MachineIdentity& other) const {
    return same_machine(other) &&
           (ipc_namespace == other.ipc_namespace || pid_namespace == other.pid_namespace);
  }
};

// What a rank publishes: its node (its launcher's word) and its machine.
Bytes encode_placement(int node, const MachineIdentity& machine);
// Error(Errc::protocol_error) naming `rank` when `published` is not what encode_placement makes.
std::pair<int, MachineIdentity> decode_placement(const Bytes& published, int rank);

struct PlacementCheck {
  bool network_only = false;  // keep UCX off shared memory: another node shares it
  std::string why;            // for the log, when network_only
};

// Checks every rank's node against its machine, for rank `rank`. Error
// (Errc::invalid_environment) naming two ranks that claim one node on different machines.
PlacementCheck check_placement(std::span<const int> node_of_rank,
                               std::span<const MachineIdentity> machine_of_rank, int rank);

// Whether this machine has an RDMA device (/sys/class/infiniband lists InfiniBand and
// RoCE adapters alike): without one, UCX reaches other nodes over TCP only.
bool has_rdma_devices();

// For each rank, where it runs, as failure messages end: "; it ran on node 1 (node1), with
// ranks 2-3". A node lost whole fails each of its ranks, and each failure names the rest.
std::vector<std::string> describe_places(std::span<const int> node_of_rank,
                                         std::span<const MachineIdentity> machine_of_rank);

}  // namespace braid::transport::detail
