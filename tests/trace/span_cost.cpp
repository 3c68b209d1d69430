// Prints the cost of one trace::Span with tracing off and on (a benchmark, not a test:
// `meson test --benchmark trace_span_cost`). Timings vary by machine; nothing asserts them.
#include <chrono>
#include <cstdio>

#include <braid/trace/recorder.hpp>
#include <braid/trace/span.hpp>

namespace {

using braid::trace::Category;

// Records are cleared between rounds so that memory stays bounded when tracing is on.
constexpr int kSpansPerRound = 100000;

double ns_per_span(bool on, int rounds) {
  braid::trace::set_enabled(on);
  double total_ns = 0;
  for (int round = 0; round < rounds; ++round) {
    braid::trace::clear();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kSpansPerRound; ++i) {
      braid::trace::Span span(Category::comm, "all_reduce", {}, static_cast<std::uint64_t>(i));
    }
    total_ns +=
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  }
  braid::trace::set_enabled(false);
  braid::trace::clear();
  return total_ns / (static_cast<double>(kSpansPerRound) * rounds);
}

}  // namespace

int main() {
  ns_per_span(true, 2);  // warm up: registers this thread, faults the chunks in
  std::printf("trace::Span, tracing off: %6.2f ns per span\n", ns_per_span(false, 100));
  std::printf("trace::Span, tracing on:  %6.2f ns per span\n", ns_per_span(true, 20));
  std::printf("steady_clock::now():      %6.2f ns per call\n", [] {
    constexpr int kCalls = 1000000;
    std::int64_t sink = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) sink += braid::trace::now_ns();
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    return sink != 0 ? ns / kCalls : 0.0;
  }());
  return 0;
}
