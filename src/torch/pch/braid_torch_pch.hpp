// The headers nearly every libbraid_torch source includes, compiled once per build
// (meson's cpp_pch) instead of once per source: libtorch's <torch/torch.h> dominates each
// source's parse, paid by each of the library's sources without it (docs/layers/torch.md).
// What goes here changes rarely; a change to any of it rebuilds every source of the target.

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>
