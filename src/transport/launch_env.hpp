// What reading a launcher's environment is made of, shared by bootstrap.cpp (which
// convention, the store, the description) and slurm_env.cpp (the Slurm convention, which
// has more to read than the others). The rules themselves are documented once, in
// <braid/transport/bootstrap.hpp>.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>

namespace braid::transport::detail {

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(Errc::invalid_environment, fmt::format(format, std::forward<Args>(args)...));
}

// What one launcher calls each quantity; empty: it has no such variable.
struct Convention {
  std::string_view source;
  std::string_view rank, world_size, local_rank, local_world_size, node_rank, num_nodes;

  std::array<std::string_view, 6> names() const {
    return {rank, world_size, local_rank, local_world_size, node_rank, num_nodes};
  }
};

// Reads one variable, empty counting as unset. BRAID_* goes through the knob table, so a
// knob missing from it is caught on first use.
class EnvReader {
 public:
  explicit EnvReader(const config::EnvLookup& env) : env_(env) {}

  std::optional<std::string> text(std::string_view name) const {
    if (name.empty()) return std::nullopt;
    std::string value = name.starts_with("BRAID_")
                            ? config::string_value(name, env_)
                            : std::string(config::trim(env_(name).value_or("")));
    if (value.empty()) return std::nullopt;
    return value;
  }

  // `step` where it is set, else `older`: srun's SLURM_STEP_* before the names that may
  // still describe the allocation (srun --preserve-env).
  std::string_view step_or(std::string_view step, std::string_view older) const {
    return text(step) ? step : older;
  }

 private:
  const config::EnvLookup& env_;
};

// A quantity and how to name it in a message: "RANK=3", or "local world size 2 (derived)".
struct Count {
  int value = 0;
  std::string shown;
  std::string_view derived_as;  // "local rank" where derived, else empty
};

Count derived(std::string_view what, int value);

// nullopt where unset; throws for a value that is no integer, below `minimum` or past INT_MAX.
std::optional<Count> read_count(const EnvReader& reader, std::string_view name, int minimum);

// The six numbers of a launch, each with where it came from.
struct Ranks {
  std::string_view source;
  Count rank, world, local_rank, local_world, node_rank, nodes;
};

// Reads convention `c` whole, deriving what it leaves out; `local_world` where the caller
// found it elsewhere (Slurm's task list).
Ranks resolve_ranks(const Convention& c, const EnvReader& reader, std::optional<Count> local_world);

// Where the store is, and why there (for LaunchInfo::description).
struct StoreChoice {
  std::string host;
  std::uint16_t port = 0;
  std::string origin;
  std::optional<EtcdAddress> etcd;  // BRAID_STORE=etcd://...: host and port are its first member
};

// slurm_env.cpp: the Slurm convention, its checks, and its store (rule 4 of bootstrap.hpp;
// nullopt where SLURM_JOB_ID, or across nodes both node lists, are unset).
Ranks read_slurm(const EnvReader& reader);
std::optional<StoreChoice> slurm_store(const EnvReader& reader, bool one_node);

}  // namespace braid::transport::detail
