// A link's rate as tc reads it ("10gbit"), for braid-run --link-rate and braid-bench's
// link share: one parser for both.
#pragma once

#include <string>

namespace braid::launcher {

struct LinkRate {
  std::string text;             // as tc reads it: "1gbit", "100mbit"
  double bytes_per_second = 0;  // the same, in bytes

  // Parses "<number><unit>", unit one of bit, kbit, mbit, gbit, tbit (tc's decimal bit
  // rates). std::invalid_argument naming the text when it is not one.
  static LinkRate parse(const std::string& text);
};

}  // namespace braid::launcher
