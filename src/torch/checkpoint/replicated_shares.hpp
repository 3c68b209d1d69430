// Tensors every rank holds alike (TrainingState::replicated), saved once over the ranks
// rather than once per rank, as PyTorch's distributed checkpoint saves a replicated tensor
// once: each rank keeps a share (elements [r*chunk, (r+1)*chunk) of the tensor flattened,
// chunk = ceil(numel / world)) beside a blob "replicated:<name>" with the whole tensor's
// type and shape, and a restore gathers the shares whole (an all-gather per tensor). Both
// checkpoints save so; a restore takes one step from one source on every rank, so every
// rank's share is there to gather.
#pragma once

#include <vector>

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

// Not collective: the whole state from every rank's file of one step, read by one process
// (a job restoring at another size than the one that saved: `shares[r]` is rank r's state
// of the saving job, marked). Each replicated tensor is its shares joined in rank order;
// the other tensors and the blobs are rank `own_from`'s (the program says which old rank
// held what this one needs: the same tensor-parallel slice and stage, say). With
// `own_from` < 0, a tensor that is not replicated is an Error(Errc::invalid_argument)
// naming it: a rank's own state (a shard of ZeRO or FSDP) has no owner in a job of
// another size.
TrainingState join(std::vector<TrainingState> shares, int own_from = -1);

}  // namespace braid::torch::replicated_shares
