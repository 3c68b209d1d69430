// HierarchyPlan: how a communicator's members group into nodes, and the sub-groups a
// hierarchical collective runs in. Pure data, computed from each member's node (World::
// node_of), so every rank computes the same plan without exchanging a message.
//
// Two shapes:
//  - Uniform (every node holds the same number L of members): "rails". Member i of every
//    node forms cross-node group i, as NCCL's rings and Horovod's hierarchical all-reduce
//    do. A hierarchical all-reduce reduce-scatters within the node (member i ends with
//    block i), all-reduces block i across its rail, and all-gathers within the node: each
//    rank moves 1/L of the vector across nodes, and every node link is busy at once.
//  - Uneven (Slurm's "2(x3),1"): "leaders". The first member of each node reduces its
//    node's vector, the leaders all-reduce it among themselves, and each leader
//    broadcasts the result within its node.
//
// Nodes are numbered by first appearance in communicator rank order (not by the
// launcher's node ranks), so the plan of a split communicator is dense from 0.
#pragma once

#include <span>
#include <vector>

namespace braid::collectives {

struct HierarchyPlan {
  // `node_of_member[r]`: the node of communicator rank r (any integers; equal means same
  // node). `rank`: this rank's index. InvariantError for an empty span or a rank outside it.
  static HierarchyPlan from_nodes(std::span<const int> node_of_member, int rank);

  int nodes = 1;                 // distinct nodes among the members
  bool uniform = true;           // every node holds the same number of members
  std::vector<int> node_of;      // communicator rank -> dense node index (first appearance)
  std::vector<int> local_group;  // communicator ranks on this rank's node, in rank order
  int local_rank = 0;            // this rank's index in local_group
  // Uniform: the members with this rank's local index, one per node in node order (the
  // rail). Uneven: every node's first member (the leaders), in node order; empty unless
  // this rank is a leader.
  std::vector<int> cross_group;
  int cross_rank = -1;  // this rank's index in cross_group, -1 when it is not in one

  // Members sit on more than one node and some node holds several of them: only then does
  // a hierarchical algorithm differ from a flat one.
  bool worth_it() const noexcept {
    return nodes > 1 && node_of.size() > static_cast<std::size_t>(nodes);
  }
  bool is_leader() const noexcept { return local_rank == 0; }
};

}  // namespace braid::collectives
