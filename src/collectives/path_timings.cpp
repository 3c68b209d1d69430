#include "collectives/path_timings.hpp"

#include <algorithm>
#include <bit>

namespace braid::collectives::detail {

std::size_t PathTimings::class_of(std::size_t bytes) noexcept {
  return bytes == 0 ? 0 : static_cast<std::size_t>(std::bit_width(bytes) - 1);
}

PathTimings::Path PathTimings::choose(std::size_t bytes) noexcept {
  SizeClass& size_class = classes_[class_of(bytes)];
  const auto& samples = size_class.samples;
  if (samples[0] < kFirstSamples || samples[1] < kFirstSamples) {
    // Alternate until both have their first samples: the less timed goes next.
    return samples[1] < samples[0] ? Path::second : Path::first;
  }
  ++size_class.calls;
  const bool second_faster = size_class.average_ns[1] < size_class.average_ns[0];
  const bool explore = size_class.calls % kExploreEvery == 0;
  return second_faster != explore ? Path::second : Path::first;
}

void PathTimings::record(std::size_t bytes, Path path, std::chrono::nanoseconds took) noexcept {
  SizeClass& size_class = classes_[class_of(bytes)];
  const auto way = static_cast<std::size_t>(path);
  double& average = size_class.average_ns[way];
  std::uint32_t& samples = size_class.samples[way];
  const auto sample = static_cast<double>(took.count());
  // A way's first call pays for first touches (pages pinned or mapped): not averaged.
  if (samples == 1) {
    average = sample;
  } else if (samples > 1) {
    average += (std::min(sample, kOutlier * average) - average) / kWeight;
  }
  if (samples < kFirstSamples) ++samples;
}

double PathTimings::average_ns(std::size_t bytes, Path path) const noexcept {
  return classes_[class_of(bytes)].average_ns[static_cast<std::size_t>(path)];
}

}  // namespace braid::collectives::detail
