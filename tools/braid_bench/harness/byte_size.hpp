// Byte sizes on braid-bench's command line: "65536", "64K", "64KiB", "4M", "1G".
#pragma once

#include <cstddef>
#include <string>

namespace braid::bench {

// The largest size a benchmark takes: beyond it the buffers alone would not fit a node.
inline constexpr std::size_t kMostBytes = std::size_t{64} << 30;

// Throws std::invalid_argument for text that is not a size (a sign, a fraction, an unknown
// suffix) or one above kMostBytes.
std::size_t parse_bytes(const std::string& text);

}  // namespace braid::bench
