// Reduction operators for reducing collectives.
#pragma once

#include <cstdint>
#include <string_view>

namespace braid {

// avg is sum divided by the number of contributing ranks, applied once at the end.
enum class ReduceOp : std::uint8_t { sum, avg, min, max, prod };

constexpr std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::prod:
      return "prod";
  }
  return "?";
}

}  // namespace braid
