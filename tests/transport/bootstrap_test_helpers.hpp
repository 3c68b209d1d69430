// What the bootstrap tests share: an environment from a map, the error a parse throws,
// Slurm's store port written out, and a LaunchInfo's six numbers checked at once.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/transport/bootstrap.hpp>

namespace braid::transport::bootstrap_testing {

using Vars = std::map<std::string, std::string>;

inline config::EnvLookup env_of(Vars vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// The message of the invalid_environment error parsing `vars` throws.
inline std::string error_for(Vars vars) {
  try {
    parse_launch_env(env_of(std::move(vars)));
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_environment);
    return e.detail();
  }
  ADD_FAILURE() << "parse_launch_env accepted the environment";
  return "";
}

// A Slurm step's store port as bootstrap.hpp's rule 4 gives it: 20000 + splitmix64's
// finaliser of (SLURM_JOB_ID << 32 ^ SLURM_STEP_ID) % 10000. Written out here rather than
// asked of the library, because every node of a step computes it alone and they must meet:
// a change to the formula has to fail a test, not follow it.
inline std::uint16_t slurm_step_port(std::uint64_t job, std::uint64_t step) {
  std::uint64_t mix = (job << 32) ^ step;
  mix = (mix ^ (mix >> 30)) * 0xbf58476d1ce4e5b9ULL;
  mix = (mix ^ (mix >> 27)) * 0x94d049bb133111ebULL;
  mix ^= mix >> 31;
  return static_cast<std::uint16_t>(20000 + mix % 10000);
}

inline void expect_ranks(const LaunchInfo& info, int rank, int world, int local_rank,
                         int local_world, int node_rank, int nodes) {
  EXPECT_EQ(info.rank, rank);
  EXPECT_EQ(info.world_size, world);
  EXPECT_EQ(info.local_rank, local_rank);
  EXPECT_EQ(info.local_world_size, local_world);
  EXPECT_EQ(info.node_rank, node_rank);
  EXPECT_EQ(info.num_nodes, nodes);
}

}  // namespace braid::transport::bootstrap_testing
