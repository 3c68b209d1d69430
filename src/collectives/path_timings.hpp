// PathTimings: picks between two ways of doing one operation by how long each took lately,
// per size class (a power of two of bytes).
//
// Why: a shared-memory all-reduce can copy through the segment or read peers' buffers
// directly (shared_memory_arena.hpp), and which wins depends on more than the size: on the
// 2-core dev VM (AMD EPYC under KVM) the segment path's 1 MiB all-reduce took 61 us in some
// phases and 176-204 us in others, minutes long, while reading peers took 86-92 us in
// both (its bytes cross between cores once, the segment's three times, and the cost of
// that swings with where the host runs the vCPUs). Which is faster on a crowded node
// swung the same way (4 ranks on 2 cores, 16 MiB: 4.1 against 4.5 ms one session, 4.1-5.0
// against 6.2-6.4 ms the next). Fixed size thresholds were right in one phase and 2x off
// in the other; timing both is right in each.
//
// How: each size class first tries the two ways alternately, kFirstSamples times each (the
// first call of each not counted: it pays for first touches), then takes the faster, and
// every kExploreEvery-th call the slower, so a change of phase shows within a few dozen
// calls. Each way's time is a moving average (weight 1/kWeight
// for the newest), and a sample more than kOutlier times the average counts as that
// much: a page fault or a huge-page collapse in one call does not condemn a way.
// Cost: one clock read per measured call (~44 ns on the dev VM, against calls of 5 us
// and up), and at most 1/kExploreEvery of calls on the slower way.
//
// Not thread-safe: one per arena, used on its runtime thread.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace braid::collectives::detail {

class PathTimings {
 public:
  enum class Path : std::uint32_t { first = 0, second = 1 };
  static constexpr std::uint32_t kFirstSamples = 4;
  static constexpr std::uint32_t kExploreEvery = 32;
  static constexpr double kWeight = 4.0;
  static constexpr double kOutlier = 4.0;

  // The way to take for a call of `bytes`.
  Path choose(std::size_t bytes) noexcept;
  // How long a call of `bytes` took the way it went.
  void record(std::size_t bytes, Path path, std::chrono::nanoseconds took) noexcept;
  // The current average of `path` for `bytes` (0: not yet timed).
  double average_ns(std::size_t bytes, Path path) const noexcept;

 private:
  struct SizeClass {
    std::array<double, 2> average_ns{};
    std::array<std::uint32_t, 2> samples{};
    std::uint32_t calls = 0;
  };
  static std::size_t class_of(std::size_t bytes) noexcept;

  std::array<SizeClass, 64> classes_{};
};

}  // namespace braid::collectives::detail
