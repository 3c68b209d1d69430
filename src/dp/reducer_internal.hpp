// What the Reducer's files share (<braid/dp/reducer.hpp>): a bucket and its reduction's
// turn, and the wording of a misuse. The Reducer's work is split by phase: reducer.cpp
// (construction and bucket layout), reducer_backward.cpp (gradients filling buckets, and
// their reductions launched in order), reducer_finalize.cpp (waiting for them, writing
// back, rebuilding the buckets in arrival order), reducer_clip_grad_norm.cpp.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <boost/asio/steady_timer.hpp>
#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/dp/reducer.hpp>

namespace braid::dp {
namespace detail {

[[noreturn]] inline void misuse(const collectives::Communicator& comm, std::string what) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = "ddp"});
}

inline std::string describe(const ParameterSpec& p, std::size_t index) {
  return fmt::format("'{}' (parameter {})", p.name.empty() ? "?" : p.name, index);
}

// One bucket's reduction done, for the next bucket's hook to wait on (hooks that issue
// several collectives run one bucket at a time). Touched only on the runtime thread.
struct ReductionTurn {
  explicit ReductionTurn(asio::any_io_executor executor) : timer(std::move(executor)) {
    timer.expires_at(asio::steady_timer::time_point::max());
  }
  bool done = false;
  asio::steady_timer timer;  // cancelled when done: wakes the waiter
};

}  // namespace detail

struct Reducer::Bucket {
  BucketLayout layout;
  // Shared with the gradients bound to it (gradient_as_bucket_view), which may outlive it.
  std::shared_ptr<std::byte[]> storage;
  Buffer data;
  std::size_t pending = 0;  // parameters not yet ready this iteration
  bool full = false;
  bool launched = false;
  std::optional<Future<void>> reduction;
  // Device buckets: recorded on the producer stream once the bucket's gradients are in
  // it; the bucket's reduction stream waits for it. `producer` is the stream the last gradient came
  // on (a gradient on another stream makes that stream wait for that one too).
  std::unique_ptr<Event> filled;
  Stream* producer = nullptr;
  std::unique_ptr<Event> reduced;  // the bucket's stream after its reduction, for the producer
  std::shared_ptr<detail::ReductionTurn> turn;  // with hooks that run one bucket at a time
  trace::AsyncSpan lifetime;  // "bucket": from full (every gradient in) to reduced

  Buffer slot(std::size_t position, std::size_t count) const {
    return data.slice(layout.offsets[position], count);
  }
};

}  // namespace braid::dp
