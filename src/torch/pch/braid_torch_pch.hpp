// The headers nearly every libbraid_torch source includes, compiled once per build
// (meson's cpp_pch) instead of once per source: libtorch's <torch/torch.h> alone is ~10 s of
// parsing on a 2-core machine, paid by each of the library's nineteen sources without it.
// What goes here changes rarely; a change to any of it rebuilds every source of the target.

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/error.hpp>
