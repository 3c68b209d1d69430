// Reading a timeline event's arguments as the summary does: integers written by braid's
// recorder, and a foreign file's values refused rather than thrown on.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

#include <braid/trace/sampling.hpp>
#include <braid/trace/timeline.hpp>

namespace braid::trace::detail {

// The argument as a whole integer; nullopt when it is absent or not one.
inline std::optional<std::int64_t> integer_arg(const TimelineEvent& event, std::string_view key) {
  const auto text = event.arg(key);
  if (!text) return std::nullopt;
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (error != std::errc() || end != text->data() + text->size()) return std::nullopt;
  return value;
}

// How many calls a span stands for: its "sampled" argument, else 1. Clamped to what
// BRAID_TRACE_SAMPLE_EVERY accepts, so a corrupt or foreign file cannot overflow the sums.
inline std::int64_t weight_of(const TimelineEvent& event) {
  return std::clamp<std::int64_t>(integer_arg(event, "sampled").value_or(1), 1,
                                  SmallOpSampling::kMostEvery);
}

}  // namespace braid::trace::detail
