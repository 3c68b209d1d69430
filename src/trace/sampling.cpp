#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/trace/sampling.hpp>

namespace braid::trace {

SmallOpSampling SmallOpSampling::from_environment(const config::EnvLookup& env) {
  const std::size_t below =
      config::kib_value("BRAID_TRACE_SAMPLE_KIB", 0, std::int64_t{1} << 30, env);
  const std::int64_t every = config::int_value("BRAID_TRACE_SAMPLE_EVERY", env);
  if (every < 1 || every > kMostEvery) {
    throw Error(Errc::invalid_environment,
                fmt::format("BRAID_TRACE_SAMPLE_EVERY={} is outside 1..{}", every, kMostEvery));
  }
  return SmallOpSampling(below, static_cast<std::uint32_t>(every));
}

}  // namespace braid::trace
