// Tensors every rank holds alike (TrainingState::replicated), saved once over the ranks
// rather than once per rank, as PyTorch's distributed checkpoint saves a replicated tensor
// once: each rank keeps a share (elements [r*chunk, (r+1)*chunk) of the tensor flattened,
// chunk = ceil(numel / world)) beside a blob "replicated:<name>" with the whole tensor's
// type and shape, and a restore gathers the shares whole (an all-gather per tensor). Both
// checkpoints save so; a restore takes one step from one source on every rank, so every
// rank's share is there to gather.
#pragma once

#include <braid/collectives/communicator.hpp>
#include <braid/torch/checkpoint/disk_checkpoints.hpp>

namespace braid::torch::replicated_shares {

// `state` with each replicated tensor replaced by rank `rank`'s share of it (a view, not a
// copy) and its blob; the other tensors as they are. The result names nothing replicated.
TrainingState split(const TrainingState& state, int rank, int world);

// Names in state.replicated the tensors that split() made shares of (after a decode).
void mark(TrainingState& state);

// Collective: each share marked in `state` gathered whole from every rank's, in place.
void gather(collectives::Communicator& comm, TrainingState& state);

}  // namespace braid::torch::replicated_shares
