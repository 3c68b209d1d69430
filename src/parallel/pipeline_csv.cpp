// Schedules in PyTorch's CSV (pipeline_schedule.hpp): what _dump_csv writes (csv.writer,
// one row per rank, each action's text in a cell) and _load_csv reads (csv.reader; an empty
// cell, as a padded grid leaves, is an idle step and is skipped).
#include <algorithm>
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/parallel/pipeline_schedule.hpp>

namespace braid::parallel {

std::string to_csv(const Schedule& schedule) {
  std::string out;
  for (const auto& list : schedule.actions) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (i > 0) out += ',';
      out += to_string(list[i]);
    }
    out += '\n';
  }
  return out;
}

// Rows end at "\n" or "\r\n" (Python's csv writes the latter); a last line without one is
// a row too, and an empty line a rank with no actions, as csv.reader reads them.
Schedule from_csv(std::string_view text, std::string name) {
  // Compute actions plus a transfer or two each, as a lowered schedule holds them.
  constexpr std::int64_t kMaxCsvActions = 4 * kMaxScheduleActions;
  Schedule schedule{.name = std::move(name)};
  int row = 0;
  std::int64_t total_actions = 0;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    if (line.ends_with('\r')) line.remove_suffix(1);
    std::vector<Action> actions;
    int cell = 0;
    while (true) {
      const std::size_t comma = line.find(',');
      const std::string_view field = line.substr(0, comma);
      if (field.find_first_not_of(" \t") != std::string_view::npos) {
        try {
          actions.push_back(parse_action(field));
        } catch (const Error& e) {
          throw Error(Errc::invalid_argument,
                      fmt::format("CSV row {} cell {}: {}", row, cell, e.detail()), e.context());
        }
      }
      if (comma == std::string_view::npos) break;
      line.remove_prefix(comma + 1);
      ++cell;
    }
    if (row >= kMaxStages) {
      throw Error(
          Errc::invalid_argument,
          fmt::format("the CSV has more than {} rows (ranks), the limit of a schedule", kMaxStages),
          ErrorContext{.operation = "pipeline schedule"});
    }
    total_actions += static_cast<std::int64_t>(actions.size());
    if (total_actions > kMaxCsvActions) {
      throw Error(Errc::invalid_argument,
                  fmt::format("the CSV holds more than {} actions, the limit of a schedule with "
                              "its transfers",
                              kMaxCsvActions),
                  ErrorContext{.operation = "pipeline schedule"});
    }
    for (const Action& action : actions) {
      // Checked before they size anything: a stage or microbatch number sizes tables.
      if (action.stage >= kMaxStages || action.microbatch >= kMaxMicrobatches) {
        throw Error(
            Errc::invalid_argument,
            fmt::format("CSV row {}: {} names {} {}, past the limit of {}", row, to_string(action),
                        action.stage >= kMaxStages ? "stage" : "microbatch",
                        action.stage >= kMaxStages ? action.stage : action.microbatch,
                        action.stage >= kMaxStages ? kMaxStages - 1 : kMaxMicrobatches - 1),
            ErrorContext{.operation = "pipeline schedule"});
      }
      schedule.stages = std::max(schedule.stages, action.stage + 1);
      schedule.microbatches = std::max(schedule.microbatches, action.microbatch + 1);
      if (static_cast<int>(schedule.stage_rank.size()) < schedule.stages) {
        schedule.stage_rank.resize(schedule.stages, -1);
      }
      // A stage's first appearance places it; validate() refuses it on a second rank.
      if (schedule.stage_rank[action.stage] == -1) schedule.stage_rank[action.stage] = row;
    }
    schedule.actions.push_back(std::move(actions));
    ++row;
  }
  schedule.ranks = row;
  // The planner's tables are stages x microbatches: bounded like a generated schedule's.
  if (const std::int64_t cells = std::int64_t{schedule.stages} * schedule.microbatches;
      cells > kMaxScheduleActions) {
    throw Error(Errc::invalid_argument,
                fmt::format("the CSV names {} stages and {} microbatches, {} pairs, past the "
                            "limit of {}",
                            schedule.stages, schedule.microbatches, cells, kMaxScheduleActions),
                ErrorContext{.operation = "pipeline schedule"});
  }
  if (schedule.stages == 0) {
    throw Error(Errc::invalid_argument, "the CSV holds no pipeline action",
                ErrorContext{.operation = "pipeline schedule"});
  }
  return schedule;
}

}  // namespace braid::parallel
