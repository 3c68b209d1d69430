#include "transport/machine_identity.hpp"

#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include <braid/core/error.hpp>

#include "transport/rank_list.hpp"

namespace braid::transport::detail {
namespace {

std::uint64_t namespace_inode(const char* path) {
  struct stat st {};
  return ::stat(path, &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

}  // namespace

MachineIdentity MachineIdentity::of_this_process() {
  MachineIdentity machine;
  std::array<char, 256> host{};
  machine.hostname = ::gethostname(host.data(), host.size() - 1) == 0 && host[0] != '\0'
                         ? std::string(host.data())
                         : "unnamed";
  std::ifstream boot_id("/proc/sys/kernel/random/boot_id");
  std::getline(boot_id, machine.boot_id);
  if (machine.boot_id.empty()) machine.boot_id = "unknown";
  machine.ipc_namespace = namespace_inode("/proc/self/ns/ipc");
  machine.pid_namespace = namespace_inode("/proc/self/ns/pid");
  return machine;
}

Bytes encode_placement(int node, const MachineIdentity& machine) {
  const std::string text = fmt::format("{} {} {} {} {}", node, machine.hostname, machine.boot_id,
                                       machine.ipc_namespace, machine.pid_namespace);
  return Bytes(text.begin(), text.end());
}

std::pair<int, MachineIdentity> decode_placement(const Bytes& published, int rank) {
  std::istringstream in(std::string(published.begin(), published.end()));
  int node = -1;
  MachineIdentity machine;
  in >> node >> machine.hostname >> machine.boot_id >> machine.ipc_namespace >>
      machine.pid_namespace;
  if (!in || node < 0) {
    throw Error(Errc::protocol_error,
                fmt::format("rank {} published a placement this rank cannot read ({} bytes); "
                            "is it running another version of braid?",
                            rank, published.size()),
                {.peer = rank, .operation = "World::join"});
  }
  return {node, std::move(machine)};
}

PlacementCheck check_placement(std::span<const int> node_of_rank,
                               std::span<const MachineIdentity> machine_of_rank, int rank) {
  PlacementCheck check;
  const auto me = static_cast<std::size_t>(rank);
  std::vector<int> sharing;  // ranks of other nodes that could reach this one's memory
  std::unordered_map<int, std::size_t> first_of_node;
  for (std::size_t r = 0; r < node_of_rank.size(); ++r) {
    // Every rank finds the same first contradiction, so every rank reports the same pair.
    const auto [first, inserted] = first_of_node.try_emplace(node_of_rank[r], r);
    if (!inserted && !machine_of_rank[first->second].same_machine(machine_of_rank[r])) {
      throw Error(Errc::invalid_environment,
                  fmt::format("ranks {} and {} both run on node {} by their launchers' word, "
                              "but on different machines (their kernels' boot ids differ): "
                              "give each machine its own node rank",
                              first->second, r, node_of_rank[r]),
                  {.rank = rank, .operation = "World::join"});
    }
    if (node_of_rank[r] != node_of_rank[me] &&
        machine_of_rank[r].shares_memory_with(machine_of_rank[me])) {
      sharing.push_back(static_cast<int>(r));
    }
  }
  if (!sharing.empty()) {
    check.network_only = true;
    check.why = fmt::format(
        "rank(s) {} of other nodes run on this machine and share its IPC or PID namespace, "
        "so UCX could move their bytes through memory: UCX is kept to its network transports "
        "(UCX_TLS=^sm), so that what crosses nodes crosses the network",
        list_ranks(sharing));
  }
  return check;
}

std::vector<std::string> describe_places(std::span<const int> node_of_rank,
                                         std::span<const MachineIdentity> machine_of_rank) {
  std::map<int, std::vector<int>> ranks_of_node;
  for (std::size_t r = 0; r < node_of_rank.size(); ++r) {
    ranks_of_node[node_of_rank[r]].push_back(static_cast<int>(r));
  }
  std::map<int, std::string> listed;
  for (const auto& [node, ranks] : ranks_of_node) {
    listed[node] = fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", list_ranks(ranks));
  }
  std::vector<std::string> places;
  for (std::size_t r = 0; r < node_of_rank.size(); ++r) {
    places.push_back(fmt::format("; it ran on node {} ({}), with {}", node_of_rank[r],
                                 machine_of_rank[r].hostname, listed[node_of_rank[r]]));
  }
  return places;
}

bool has_rdma_devices() {
  std::error_code error;
  const std::filesystem::directory_iterator devices("/sys/class/infiniband", error);
  return !error && devices != std::filesystem::directory_iterator();
}

}  // namespace braid::transport::detail
