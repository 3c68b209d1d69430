// User-marked regions: how an application tells the timeline what its compute is, so
// `braid-trace summary` can say how much communication that compute hid.
//
//   {
//     braid::trace::ComputeRegion forward("forward");
//     auto loss = model.forward(batch);
//   }
//
//   // in a coroutine: the span covers the whole awaited operation, however many times
//   // it suspends and on whichever thread it resumes
//   co_await braid::trace::traced(braid::trace::Category::compute, "optimizer",
//                                 step_optimizer());
//
// Names are string literals or trace::intern()ed strings (recorder.hpp); with tracing off
// each costs one relaxed load.
#pragma once

#include <cstdint>
#include <utility>

#include <boost/asio/awaitable.hpp>

#include <braid/trace/compute_span.hpp>
#include <braid/trace/span.hpp>

namespace braid::trace {

namespace asio = boost::asio;

// A compute span over a C++ scope, on the calling thread's track (or `track`), with the
// time its thread spent off its core (compute_span.hpp).
class ComputeRegion {
 public:
  explicit ComputeRegion(Name name, Track track = {}) noexcept : span_(name, track) {}
  ComputeRegion(const ComputeRegion&) = delete;
  ComputeRegion& operator=(const ComputeRegion&) = delete;
  // One number to show with the span ("step", 12).
  void arg(Name key, std::int64_t value) noexcept { span_.arg(key, value); }

 private:
  ComputeSpan span_;
};

// Awaits `work` inside an async span of `category`: begun before the first suspension,
// ended when `work` completes or throws.
template <class T>
asio::awaitable<T> traced(Category category, Name name, asio::awaitable<T> work, Track track = {},
                          std::uint64_t bytes = 0) {
  AsyncSpan span(category, name, track, bytes);
  co_return co_await std::move(work);
}

inline asio::awaitable<void> traced(Category category, Name name, asio::awaitable<void> work,
                                    Track track = {}, std::uint64_t bytes = 0) {
  AsyncSpan span(category, name, track, bytes);
  co_await std::move(work);
}

}  // namespace braid::trace
