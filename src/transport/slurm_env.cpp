// The Slurm convention of parse_launch_env (rules in <braid/transport/bootstrap.hpp>):
// the step's variables before their older names, the task list walked and the node list
// counted (never expanded), the agreement of all they say, and the job's store address.
#include <algorithm>
#include <charconv>
#include <climits>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <braid/transport/bootstrap.hpp>
#include <braid/transport/hostlist.hpp>

#include "transport/launch_env.hpp"

namespace braid::transport {
namespace detail {
namespace {

// What a Slurm task list such as "4(x2),3" (4, 4, 3 tasks) says. Walked group by group,
// never expanded, so "1(x1000000000)" costs nothing.
struct TaskList {
  std::string_view name;  // SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE
  std::string text;
  std::int64_t nodes = 0;
  std::int64_t tasks = 0;      // the sum, saturating past INT_MAX: no world is that large
  bool varies = false;         // not every node runs the same number
  int first = 0;               // the first node's tasks
  std::optional<int> of_node;  // the entry of the node asked for, if within the list
};

[[noreturn]] void bad_task_list(std::string_view name, std::string_view list) {
  fail("{}='{}' is not a Slurm task count list such as 4(x2),3", name, list);
}

int parse_task_count(const char*& p, const char* end, std::string_view name,
                     std::string_view list) {
  int value = 0;
  auto [next, ec] = std::from_chars(p, end, value);
  if (ec != std::errc() || value < 1) bad_task_list(name, list);
  p = next;
  return value;
}

TaskList walk_task_list(std::string_view name, std::string text, std::optional<int> node) {
  TaskList list{.name = name, .text = std::move(text)};
  const char* p = list.text.data();
  const char* end = p + list.text.size();
  while (true) {
    int tasks = parse_task_count(p, end, name, list.text);
    int repeat = 1;
    if (p != end && *p == '(') {
      if (end - p < 2 || p[1] != 'x') bad_task_list(name, list.text);
      p += 2;
      repeat = parse_task_count(p, end, name, list.text);
      if (p == end || *p != ')') bad_task_list(name, list.text);
      ++p;
    }
    if (node && !list.of_node && *node < list.nodes + repeat) list.of_node = tasks;
    if (list.nodes == 0) list.first = tasks;
    list.varies = list.varies || tasks != list.first;
    list.nodes += repeat;
    list.tasks = std::min(list.tasks + std::int64_t{tasks} * repeat, std::int64_t{INT_MAX} + 1);
    if (p == end) return list;
    if (*p != ',') bad_task_list(name, list.text);
    ++p;
  }
}

// This node's number of tasks: its entry in the task list, else SLURM_NTASKS_PER_NODE.
std::optional<Count> slurm_local_world_size(const EnvReader& reader,
                                            const std::optional<TaskList>& list,
                                            const std::optional<Count>& node) {
  if (!list) return read_count(reader, "SLURM_NTASKS_PER_NODE", 1);
  if (list->of_node) {
    return Count{*list->of_node,
                 fmt::format("the {} task(s) {}='{}' gives node {}", *list->of_node, list->name,
                             list->text, node->value),
                 {}};
  }
  if (node) {
    fail("SLURM_NODEID={} is beyond the {} node(s) in {}='{}'", node->value, list->nodes,
         list->name, list->text);
  }
  if (list->varies) {
    fail("{}='{}' differs between nodes but SLURM_NODEID is not set", list->name, list->text);
  }
  return Count{list->first, fmt::format("{}='{}'", list->name, list->text), {}};
}

// Slurm writes the number of nodes three times and the number of tasks twice; they
// must agree.
void check_slurm_agrees(const EnvReader& reader, const Convention& c,
                        const std::optional<TaskList>& tasks, const std::optional<Count>& node) {
  auto world = read_count(reader, c.world_size, 1);
  if (world && tasks && world->value != tasks->tasks) {
    fail("the Slurm variables disagree: {} but {}='{}' adds up to {} tasks", world->shown,
         tasks->name, tasks->text,
         tasks->tasks > INT_MAX ? fmt::format("more than {}", INT_MAX)
                                : std::to_string(tasks->tasks));
  }
  struct NodeCount {
    std::int64_t value;
    std::string shown;
  };
  std::vector<NodeCount> counts;
  if (auto nodes = read_count(reader, c.num_nodes, 1))
    counts.push_back({nodes->value, nodes->shown});
  if (tasks) {
    counts.push_back({tasks->nodes, fmt::format("{}='{}' lists {} node(s)", tasks->name,
                                                tasks->text, tasks->nodes)});
  }
  const std::string_view list_name = reader.step_or("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST");
  if (auto list = reader.text(list_name)) {
    const std::int64_t hosts = count_hosts(*list, list_name);
    if (node && node->value >= hosts) {
      fail("{} is beyond the {} host(s) of {}='{}'", node->shown, hosts, list_name, *list);
    }
    counts.push_back({hosts, fmt::format("{}='{}' names {} host(s)", list_name, *list, hosts)});
  }
  for (const NodeCount& count : counts) {
    if (count.value != counts.front().value) {
      fail("the Slurm variables disagree: {} but {}", counts.front().shown, count.shown);
    }
  }
}

// kSlurmStorePortBase + a hash of SLURM_JOB_ID and SLURM_STEP_ID % kSlurmStorePorts, and
// how it was made. The step is in it because a job's steps may run at once on one node
// (srun ... & srun ... &).
std::optional<std::pair<std::uint16_t, std::string>> slurm_store_port(const EnvReader& reader) {
  auto text = reader.text("SLURM_JOB_ID");
  if (!text) return std::nullopt;
  const std::int64_t job = config::parse_int(*text, "SLURM_JOB_ID");
  if (job < 0) fail("SLURM_JOB_ID={} must not be negative", job);
  std::int64_t step = 0;
  std::string step_shown = "SLURM_STEP_ID unset, step 0";
  if (auto step_text = reader.text("SLURM_STEP_ID")) {
    step = config::parse_int(*step_text, "SLURM_STEP_ID");
    if (step < 0) fail("SLURM_STEP_ID={} must not be negative", step);
    step_shown = fmt::format("SLURM_STEP_ID={}", step);
  }
  // splitmix64's finaliser: neighbouring ids land far apart.
  std::uint64_t mix = (static_cast<std::uint64_t>(job) << 32) ^ static_cast<std::uint64_t>(step);
  mix = (mix ^ (mix >> 30)) * 0xbf58476d1ce4e5b9ULL;
  mix = (mix ^ (mix >> 27)) * 0x94d049bb133111ebULL;
  mix ^= mix >> 31;
  return std::pair{static_cast<std::uint16_t>(kSlurmStorePortBase + mix % kSlurmStorePorts),
                   fmt::format("port {} + a hash of SLURM_JOB_ID={} and {} % {}",
                               kSlurmStorePortBase, job, step_shown, kSlurmStorePorts)};
}

}  // namespace

Ranks read_slurm(const EnvReader& reader) {
  const Convention c{"slurm",
                     "SLURM_PROCID",
                     reader.step_or("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
                     "SLURM_LOCALID",
                     "",
                     "SLURM_NODEID",
                     reader.step_or("SLURM_STEP_NUM_NODES", "SLURM_NNODES")};
  auto node = read_count(reader, "SLURM_NODEID", 0);
  std::optional<TaskList> tasks;
  const std::string_view list_name =
      reader.step_or("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE");
  if (auto text = reader.text(list_name)) {
    tasks = walk_task_list(list_name, std::move(*text),
                           node ? std::optional<int>(node->value) : std::nullopt);
  }
  auto local_world = slurm_local_world_size(reader, tasks, node);
  check_slurm_agrees(reader, c, tasks, node);
  return resolve_ranks(c, reader, std::move(local_world));
}

std::optional<StoreChoice> slurm_store(const EnvReader& reader, bool one_node) {
  auto port = slurm_store_port(reader);
  if (!port) return std::nullopt;
  if (one_node) {
    return StoreChoice{"127.0.0.1", port->first,
                       fmt::format("every rank on this node, {}", port->second)};
  }
  const std::string_view name = reader.step_or("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST");
  auto list = reader.text(name);
  if (!list) return std::nullopt;
  return StoreChoice{first_host(*list, name), port->first,
                     fmt::format("the first host of {}='{}', {}", name, *list, port->second)};
}

}  // namespace detail

std::optional<HostPort> slurm_store_address(const config::EnvLookup& env) {
  auto store = detail::slurm_store(detail::EnvReader(env), /*one_node=*/false);
  if (!store) return std::nullopt;
  return HostPort{std::move(store->host), store->port};
}

}  // namespace braid::transport
