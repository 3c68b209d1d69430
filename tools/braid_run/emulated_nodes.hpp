// braid-run --emulate-nodes N: one Linux machine as N nodes joined by a network, so that a
// multi-node job runs, and fails, as it would across machines.
//
// Each node is a process tree in namespaces of its own: network (its own eth0 and
// loopback), IPC and a private /dev/shm (no System V or POSIX shared memory with other
// nodes), PID (its processes cannot see or ptrace another node's, so no cross-memory
// attach), UTS (hostname node<i>) and mount (its own /proc, /sys and /dev/shm, and an
// /etc/hosts naming every node, as a cluster's DNS would). The nodes' eth0s are veth pairs
// into a bridge, the switch, which lives in a network namespace of braid-run's own; node i
// has 198.18.0.0/15's address i + 1 (the benchmarking range, never routed). With a link
// rate, each link is shaped by `tc ... tbf` in both directions.
//
// Nothing is made in the machine's own namespaces, and every namespace lives only as long
// as a process in it: the switch's as long as braid-run, a node's as long as its first
// process (the node's init, which dies with braid-run through PR_SET_PDEATHSIG and takes
// every process of its node with it). So whatever ends braid-run, SIGKILL included, the
// kernel removes the nodes, their links and the bridge; there is nothing to clean up.
//
// Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's `ip` (and `tc` for a rate).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <sys/types.h>
#include <vector>

#include "link_rate.hpp"

namespace braid::launcher {

class EmulatedNodes {
 public:
  // Moves braid-run into a network namespace of its own and makes the switch there.
  // std::runtime_error saying what is missing (root, ip, tc) when it cannot.
  EmulatedNodes(int nodes, std::optional<LinkRate> rate);
  ~EmulatedNodes();
  EmulatedNodes(const EmulatedNodes&) = delete;
  EmulatedNodes& operator=(const EmulatedNodes&) = delete;

  // Node `node`'s address: 198.18.0.0 + node + 1.
  static std::string address_of(int node);
  // Its hostname, which every node's /etc/hosts resolves to that address: node<i>.
  static std::string node_name(int node);

  // Starts node `node` (again, after its init died: a fresh node in its place, with a new
  // link): its init, in new namespaces, with its link up, runs `argv` (a
  // braid-run for that node) with `env`, reaps what is orphaned in the node, and exits with
  // the status of `argv`'s process (128 + signal when a signal ended it). Returns the init's
  // pid; signalled with SIGTERM it passes the signal on (as its own process group holds
  // both), and SIGKILL ends the node whole. `blocked_mask`: restored for `argv`'s process.
  // `agent_argv`, when given, runs beside `argv` for the node's life (its launch agent).
  pid_t start_node(int node, const std::vector<std::string>& argv,
                   const std::vector<std::string>& env, const sigset_t& blocked_mask,
                   const std::vector<std::string>& agent_argv = {});

  // One line per node: the bytes it sent and received over its link so far.
  std::vector<std::string> traffic_report() const;

 private:
  int nodes_;
  std::optional<LinkRate> rate_;
  // Each node's network namespace, held open so that its link (and its counters) outlive
  // the node's processes until this object goes; closed with braid-run however it ends.
  std::vector<int> node_netns_;  // by node; -1 before it starts
  std::string hosts_;            // every node's /etc/hosts
};

}  // namespace braid::launcher
