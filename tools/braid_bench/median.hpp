// The median of a benchmark's rounds: the figure each mode reports, so that one slow round
// (another process taking the core) does not move it.
#pragma once

#include <algorithm>
#include <vector>

namespace braid::bench {

// The upper median for an even count. `values` must not be empty.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace braid::bench
