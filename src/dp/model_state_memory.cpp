#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/dp/model_state_memory.hpp>

namespace braid::dp {

ModelStateMemory estimate_model_state_memory(const ModelStateShape& shape, ShardedState sharded) {
  if (shape.parameters < 0 || shape.ranks < 1 || shape.parameter_bytes < 0 ||
      shape.gradient_bytes < 0 || shape.optimizer_state_bytes < 0 || shape.largest_unit < 0 ||
      shape.largest_unit > shape.parameters) {
    throw Error(Errc::invalid_argument,
                fmt::format("a model state of {} parameters on {} ranks, {}, {} and {} bytes per "
                            "parameter, gradient and optimizer state, largest unit {}: counts "
                            "and sizes must not be negative, ranks at least 1, the unit at most "
                            "the parameters",
                            shape.parameters, shape.ranks, shape.parameter_bytes,
                            shape.gradient_bytes, shape.optimizer_state_bytes, shape.largest_unit),
                {.operation = "estimate_model_state_memory"});
  }
  const std::int64_t whole = shape.parameters;
  const std::int64_t shard = (shape.parameters + shape.ranks - 1) / shape.ranks;
  const auto at_least = [&](ShardedState s) { return sharded >= s ? shard : whole; };
  ModelStateMemory m;
  m.parameters = shape.parameter_bytes * at_least(ShardedState::parameters);
  m.gradients = shape.gradient_bytes * at_least(ShardedState::gradients);
  m.optimizer_state = shape.optimizer_state_bytes * at_least(ShardedState::optimizer);
  if (sharded >= ShardedState::gradients) m.transient += shape.gradient_bytes * shape.largest_unit;
  if (sharded >= ShardedState::parameters) {
    m.transient += shape.parameter_bytes * shape.largest_unit;
  }
  return m;
}

}  // namespace braid::dp
