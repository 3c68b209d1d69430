#include <algorithm>

#include <braid/collectives/hierarchy.hpp>
#include <braid/core/enforce.hpp>

namespace braid::collectives {

HierarchyPlan HierarchyPlan::from_nodes(std::span<const int> node_of_member, int rank) {
  BRAID_ENFORCE(!node_of_member.empty() && rank >= 0 &&
                    static_cast<std::size_t>(rank) < node_of_member.size(),
                "rank {} of a communicator of {} members", rank, node_of_member.size());
  HierarchyPlan plan;
  std::vector<int> seen;                  // launcher node ids in order of first appearance
  std::vector<std::vector<int>> members;  // dense node -> communicator ranks
  for (std::size_t r = 0; r < node_of_member.size(); ++r) {
    auto at = std::find(seen.begin(), seen.end(), node_of_member[r]);
    if (at == seen.end()) {
      seen.push_back(node_of_member[r]);
      members.emplace_back();
      at = seen.end() - 1;
    }
    const auto dense = static_cast<int>(at - seen.begin());
    plan.node_of.push_back(dense);
    members[static_cast<std::size_t>(dense)].push_back(static_cast<int>(r));
  }
  plan.nodes = static_cast<int>(members.size());
  const std::size_t per_node = members.front().size();
  plan.uniform = std::all_of(members.begin(), members.end(),
                             [per_node](const auto& m) { return m.size() == per_node; });
  const int my_node = plan.node_of[static_cast<std::size_t>(rank)];
  plan.local_group = members[static_cast<std::size_t>(my_node)];
  plan.local_rank = static_cast<int>(
      std::find(plan.local_group.begin(), plan.local_group.end(), rank) - plan.local_group.begin());
  if (plan.uniform) {
    for (const auto& node : members) {
      plan.cross_group.push_back(node[static_cast<std::size_t>(plan.local_rank)]);
    }
    plan.cross_rank = my_node;
  } else if (plan.local_rank == 0) {
    for (const auto& node : members) plan.cross_group.push_back(node.front());
    plan.cross_rank = my_node;
  }
  return plan;
}

}  // namespace braid::collectives
