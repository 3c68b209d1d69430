// Checking all-reduce results against the serial reference (typed_values.hpp), shared by
// the tests that run it on different memory.
#pragma once

#include <string>
#include <string_view>

#include <boost/asio/awaitable.hpp>
#include <fmt/format.h>

#include <braid/collectives/communicator.hpp>

#include "typed_values.hpp"

namespace braid::collectives::testing {

// Records the first element that differs from the reference, for one readable failure.
struct Mismatch {
  std::string what;
  // `context` is only formatted for the first mismatch: checks run per element.
  template <class Context>
  void check(const TypedVector& got, std::size_t i, double expected, Context&& context) {
    if (what.empty() && got.get(i) != expected) {
      what = fmt::format("{}: element {} is {}, expected {}", context(), i, got.get(i), expected);
    }
  }
};

// One all-reduce from `input` into `output` and one in place on `input`, both checked
// against the serial reference. `input` is filled with this rank's values first.
inline asio::awaitable<void> check_all_reduce(Communicator& comm, TypedVector& input,
                                              TypedVector& output, ReduceOp op,
                                              std::string_view label, Mismatch& mismatch) {
  const int world = comm.size();
  const DType dtype = input.dtype();
  const std::size_t count = input.count();
  for (std::size_t i = 0; i < count; ++i) input.set(i, value_for(comm.rank(), i, dtype, op));
  const std::string where = fmt::format("{} {} {} count {} rank {}", label, to_string(dtype),
                                        to_string(op), count, comm.rank());
  co_await comm.all_reduce(input.buffer(), output.buffer(), op);
  for (std::size_t i = 0; i < count; ++i) {
    mismatch.check(output, i, reference(world, i, dtype, op), [&] { return where; });
  }
  co_await comm.all_reduce(input.buffer(), op);  // and in place
  for (std::size_t i = 0; i < count; ++i) {
    mismatch.check(input, i, reference(world, i, dtype, op), [&] { return "in place " + where; });
  }
}

}  // namespace braid::collectives::testing
