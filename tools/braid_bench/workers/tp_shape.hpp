// The transformer blocks braid-bench tp trains and how long, as its driver (modes/tp.cpp)
// takes them and hands them to its worker and its PyTorch peer, which take the same options.
#pragma once

#include "../harness/options.hpp"

namespace braid::bench {

struct TpShape {
  int hidden = 256;
  int heads = 8;
  int layers = 2;
  int seq = 64;
  int batch = 4;
  int steps = 20;
};

inline OptionTable shape_options(TpShape& s) {
  return {count("--hidden", s.hidden, 8), count("--heads", s.heads, 1),
          count("--layers", s.layers, 1), count("--seq", s.seq, 1),
          count("--batch", s.batch, 1),   count("--steps", s.steps, 4)};
}

}  // namespace braid::bench
