// Byte sizes on braid-bench's command line: "65536", "64K", "64KiB", "4M", "1G".
#pragma once

#include <cstddef>
#include <string>

namespace braid::bench {

// Throws std::invalid_argument for text that is not a size.
std::size_t parse_bytes(const std::string& text);

}  // namespace braid::bench
