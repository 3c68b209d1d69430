// FullyShardedDataParallel's checkpoints (fully_sharded_data_parallel.hpp): the whole
// parameters by name on rank 0, loaded on any number of ranks; and each rank's shards.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/tensor_buffer.hpp>

#include "torch/data_parallel/fully_sharded_unit.hpp"

namespace braid::torch {

using ::torch::Tensor;

namespace {

[[noreturn]] void refuse(const collectives::Communicator& comm, std::string what) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = "FullyShardedDataParallel"});
}

// What a sharded checkpoint was made from: the ranks sharding each unit and the units'
// sizes. Loading needs the same.
std::string layout_text(int ranks, const std::vector<std::int64_t>& sizes) {
  return fmt::format("braid fsdp ranks {} units {}", ranks, fmt::join(sizes, ","));
}

}  // namespace

std::map<const c10::TensorImpl*, std::string> FullyShardedDataParallel::names_in(
    const ::torch::nn::Module& root) const {
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& named : root.named_parameters()) {
    names[named.value().unsafeGetTensorImpl()] = named.key();
  }
  return names;
}

std::map<std::string, at::Tensor> FullyShardedDataParallel::full_state_dict(
    const ::torch::nn::Module& root) {
  const auto names = names_in(root);
  std::map<std::string, at::Tensor> state;
  for (const auto& unit : units_) {
    // The master values whole: every shard, gathered (in their own dtype, f32 under mixed
    // precision).
    Tensor whole = ::torch::empty(
        {unit->shard_size *
         (options_.strategy == ShardingStrategy::no_shard ? 1 : shard_comm_->size())},
        unit->shard.options().requires_grad(false));
    if (options_.strategy == ShardingStrategy::no_shard) {
      whole.copy_(unit->shard.detach());
    } else {
      shard_comm_
          ->launch(shard_comm_->all_gather(as_buffer(unit->shard.detach()), as_buffer(whole)))
          .get();
    }
    if (comm_->rank() != 0) continue;
    for (std::size_t i = 0; i < unit->params.size(); ++i) {
      const auto name = names.find(unit->params[i].unsafeGetTensorImpl());
      if (name == names.end()) {
        refuse(*comm_,
               fmt::format("a parameter of unit {} is not in the root module given", unit->name));
      }
      state[name->second] =
          whole.narrow(0, unit->offsets[i], c10::multiply_integers(unit->shapes[i]))
              .view(unit->shapes[i])
              .clone();
    }
  }
  return state;
}

void FullyShardedDataParallel::load_full_state_dict(
    const ::torch::nn::Module& root, const std::map<std::string, at::Tensor>& state) {
  const auto names = names_in(root);
  ::torch::NoGradGuard no_grad;
  for (const auto& unit : units_) {
    Tensor whole = ::torch::zeros({unit->padded}, unit->shard.options().requires_grad(false));
    for (std::size_t i = 0; i < unit->params.size(); ++i) {
      const auto name = names.find(unit->params[i].unsafeGetTensorImpl());
      if (name == names.end()) {
        refuse(*comm_,
               fmt::format("a parameter of unit {} is not in the root module given", unit->name));
      }
      const auto found = state.find(name->second);
      if (found == state.end()) {
        refuse(*comm_, fmt::format("the state dict has no '{}'", name->second));
      }
      if (found->second.sizes().vec() != unit->shapes[i]) {
        refuse(*comm_, fmt::format("the state dict's '{}' has shape [{}], the model's [{}]",
                                   name->second, fmt::join(found->second.sizes(), ", "),
                                   fmt::join(unit->shapes[i], ", ")));
      }
      whole.narrow(0, unit->offsets[i], found->second.numel()).copy_(found->second.reshape({-1}));
    }
    const std::int64_t first = options_.strategy == ShardingStrategy::no_shard
                                   ? 0
                                   : unit->shard_size * shard_comm_->rank();
    unit->shard.detach().copy_(whole.narrow(0, first, unit->shard_size));
    unit->gathered = unit->gathered && options_.strategy == ShardingStrategy::no_shard;
    if (options_.strategy != ShardingStrategy::no_shard) release(*unit);
  }
}

void FullyShardedDataParallel::save_sharded(const std::string& directory) {
  std::filesystem::create_directories(directory);
  std::vector<Tensor> shards;
  for (const auto& unit : units_) shards.push_back(unit->shard.detach());
  ::torch::save(shards, fmt::format("{}/rank-{}.pt", directory, comm_->rank()));
  if (comm_->rank() == 0) {
    std::ofstream(directory + "/layout.txt") << layout_text(comm_->size(), unit_sizes()) << "\n";
  }
  comm_->launch(comm_->barrier()).get();  // every rank's file is there when this returns
}

void FullyShardedDataParallel::load_sharded(const std::string& directory) {
  std::ifstream layout(directory + "/layout.txt");
  std::string saved;
  std::getline(layout, saved);
  const std::string mine = layout_text(comm_->size(), unit_sizes());
  if (saved != mine) {
    refuse(*comm_, fmt::format("{} holds a checkpoint of '{}', and this is '{}': load the full "
                               "state dict to change the ranks or the units",
                               directory, saved.empty() ? "(nothing readable)" : saved, mine));
  }
  std::vector<Tensor> shards;
  ::torch::load(shards, fmt::format("{}/rank-{}.pt", directory, comm_->rank()));
  ::torch::NoGradGuard no_grad;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    units_[u]->shard.detach().copy_(shards.at(u));
    if (options_.strategy == ShardingStrategy::no_shard) units_[u]->gathered = false;
  }
}

}  // namespace braid::torch
