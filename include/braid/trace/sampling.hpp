// Which small collectives a trace records. A span costs ~15-20 ns on (two counter reads
// and a record), which is ~5% of an 8-byte all-reduce within a node (0.2-0.4 us) and under
// 1% only from ~2 us. So collectives moving fewer than BRAID_TRACE_SAMPLE_KIB are recorded
// one in BRAID_TRACE_SAMPLE_EVERY, and each recorded span carries "sampled" = that number:
// the summary counts it that many times (count, bytes, communication and overlap time,
// latency percentiles).
//
// A communicator's first BRAID_TRACE_SAMPLE_EVERY calls are all recorded (see
// record_whole_until), so a short run counts exactly, and a tight loop of small calls
// pays for a span one call in n.
//
// The choice is a hash of the call's sequence number, which every member of a
// communicator shares: all ranks record the same calls (the merged timeline lines them
// up), no state is kept per call, and a periodic pattern of calls (8 B, 4 KiB, 8 B, ...)
// is not sampled on one of its phases the way "every n-th call" would be.
//
//   const trace::SmallOpSampling sampling = trace::SmallOpSampling::from_environment();
//   const std::uint32_t weight = sampling.weight(bytes, sequence);
//   // 0: record nothing; 1: record the call; n > 1: record it with "sampled" = n
#pragma once

#include <cstdint>
#include <limits>

#include <braid/core/config.hpp>

namespace braid::trace {

class SmallOpSampling {
 public:
  // The most BRAID_TRACE_SAMPLE_EVERY may be, and so the most calls a span stands for.
  static constexpr std::uint32_t kMostEvery = 1 << 20;

  // Every call recorded.
  SmallOpSampling() noexcept = default;
  // Calls moving fewer than `below_bytes` are recorded one in `every` (every <= 1: all).
  SmallOpSampling(std::uint64_t below_bytes, std::uint32_t every) noexcept
      : below_bytes_(every > 1 ? below_bytes : 0),
        every_(every > 1 ? every : 1),
        threshold_(std::numeric_limits<std::uint64_t>::max() / every_) {}

  // BRAID_TRACE_SAMPLE_KIB and BRAID_TRACE_SAMPLE_EVERY; a malformed value is an
  // Error(invalid_environment) naming the variable.
  static SmallOpSampling from_environment(const config::EnvLookup& env = config::process_env());

  // Calls numbered below `sequence` are all recorded: a communicator passes its first
  // sequence number + every(), the same on every member.
  void record_whole_until(std::uint64_t sequence) noexcept { whole_until_ = sequence; }

  // 0: leave this call out. 1: record it, it stands for itself. n > 1: record it, it
  // stands for n calls of its kind. `salt` keeps communicators that run in step (the same
  // sequence numbers) from all choosing the same calls.
  std::uint32_t weight(std::uint64_t bytes, std::uint64_t sequence,
                       std::uint64_t salt = 0) const noexcept {
    if (bytes >= below_bytes_ || sequence < whole_until_) return 1;
    return mix(sequence ^ (salt * 0x9e3779b97f4a7c15ULL)) <= threshold_ ? every_ : 0;
  }

  std::uint64_t below_bytes() const noexcept { return below_bytes_; }
  std::uint32_t every() const noexcept { return every_; }

 private:
  // splitmix64's finaliser: consecutive sequence numbers map to uncorrelated values (two
  // multiplies and three xor-shifts, ~1 ns, paid only by a small call with tracing on).
  static std::uint64_t mix(std::uint64_t x) noexcept {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
  }

  std::uint64_t below_bytes_ = 0;
  std::uint32_t every_ = 1;
  std::uint64_t whole_until_ = 0;
  std::uint64_t threshold_ = std::numeric_limits<std::uint64_t>::max();
};

}  // namespace braid::trace
