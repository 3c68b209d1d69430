#include "measured_costs.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/parallel/pipeline_schedule.hpp>
#include <braid/trace/timeline.hpp>

#include "trace_set.hpp"

namespace braid::tools::plan {
namespace {

using parallel::ActionKind;
using trace_tool::TraceInputError;

// F, B, I, W as 0..3; nullopt for a transfer, REDUCE_GRAD or a name that is no action.
std::optional<std::size_t> compute_index(std::string_view name) {
  std::optional<ActionKind> kind;
  for (const ActionKind k : {ActionKind::forward, ActionKind::backward, ActionKind::backward_input,
                             ActionKind::backward_weight}) {
    if (name == parallel::to_string(k)) kind = k;
  }
  if (!kind) {
    try {
      kind = parallel::parse_action(name).kind;
    } catch (const Error&) {
      return std::nullopt;
    }
  }
  if (!parallel::is_compute(*kind)) return std::nullopt;
  return static_cast<std::size_t>(*kind);  // forward..backward_weight are 0..3
}

// The upper median, in microseconds.
double median_us(std::vector<std::int64_t> ns) {
  std::nth_element(ns.begin(), ns.begin() + static_cast<std::ptrdiff_t>(ns.size() / 2), ns.end());
  return static_cast<double>(ns[ns.size() / 2]) / 1000;
}

}  // namespace

MeasuredCosts measured_costs(const std::filesystem::path& path) {
  const trace::Timeline timeline = trace_tool::TraceSet::load(path).timeline();
  std::array<std::vector<std::int64_t>, 4> durations;
  for (const trace::RankTimeline& rank : timeline.ranks) {
    for (const trace::TimelineEvent& event : rank.events) {
      if (event.instant || event.category != "pipeline") continue;
      if (const auto index = compute_index(event.name))
        durations[*index].push_back(event.duration_ns());
    }
  }
  MeasuredCosts out;
  std::array<std::optional<double>, 4> median;
  for (std::size_t k = 0; k < 4; ++k) {
    out.spans[k] = durations[k].size();
    if (!durations[k].empty()) median[k] = median_us(std::move(durations[k]));
  }
  auto& [f, b, i, w] = median;
  if (!f) throw TraceInputError(fmt::format("{}: no pipeline F spans to measure", path.string()));
  if (!b && i && w) b = *i + *w;
  if (b && !i && !w) i = w = *b / 2;
  if (!b || !i || !w) {
    throw TraceInputError(
        fmt::format("{}: pipeline spans of neither B nor both I and W ({} B, {} I, {} W)",
                    path.string(), out.spans[1], out.spans[2], out.spans[3]));
  }
  out.costs.forward = *f;
  out.costs.backward = *b;
  out.costs.backward_input = *i;
  out.costs.backward_weight = *w;
  return out;
}

}  // namespace braid::tools::plan
