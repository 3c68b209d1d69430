#include "replicated_shares.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <braid/core/buffer.hpp>
#include <braid/core/error.hpp>
#include <braid/torch/tensor_buffer.hpp>

#include "checkpoint_format.hpp"

namespace braid::torch::replicated_shares {
namespace {

// The blob beside a share: the whole tensor's scalar type (i32) and sizes (i64 each).
constexpr std::string_view kPrefix = "replicated:";

std::string blob_name(const std::string& tensor) {
  return std::string(kPrefix) + tensor;
}

std::string describe(const at::Tensor& tensor) {
  const auto type = static_cast<std::int32_t>(tensor.scalar_type());
  std::string bytes(reinterpret_cast<const char*>(&type), sizeof type);
  bytes.append(reinterpret_cast<const char*>(tensor.sizes().data()),
               tensor.sizes().size() * sizeof(std::int64_t));
  return bytes;
}

// An empty tensor of what describe() wrote.
at::Tensor described(const std::string& bytes) {
  std::int32_t type = 0;
  std::memcpy(&type, bytes.data(), sizeof type);
  std::vector<std::int64_t> sizes((bytes.size() - sizeof type) / sizeof(std::int64_t));
  std::memcpy(sizes.data(), bytes.data() + sizeof type, sizes.size() * sizeof(std::int64_t));
  return at::empty(sizes, at::TensorOptions().dtype(static_cast<c10::ScalarType>(type)));
}

// Each rank's share of `numel` elements: the last ones shorter, or empty.
std::int64_t chunk_of(std::int64_t numel, std::int64_t world) {
  return (numel + world - 1) / world;
}

}  // namespace

TrainingState split(const TrainingState& state, int rank, int world) {
  TrainingState held{.step = state.step, .tensors = {}, .blobs = state.blobs, .replicated = {}};
  for (const auto& [name, tensor] : state.tensors) {
    if (!state.replicated.contains(name)) {
      held.tensors[name] = tensor;
      continue;
    }
    const at::Tensor flat = tensor.detach().contiguous().reshape(-1);
    const std::int64_t chunk = chunk_of(flat.numel(), world);
    const std::int64_t begin = std::min(flat.numel(), chunk * rank);
    held.tensors[name] = flat.narrow(0, begin, std::min(chunk, flat.numel() - begin));
    held.blobs[blob_name(name)] = describe(tensor);
  }
  return held;
}

void mark(TrainingState& state) {
  for (const auto& [name, bytes] : state.blobs) {
    if (name.starts_with(kPrefix)) state.replicated.insert(name.substr(kPrefix.size()));
  }
}

void gather(collectives::Communicator& comm, TrainingState& state) {
  const std::int64_t world = comm.size();
  // The ranks must name the same tensors with the same types and shapes, or the gathers
  // below would pair different tensors' shares (or wait for ones that never come).
  checkpoint_format::Checksum names;
  for (const std::string& name : state.replicated) {
    const std::string entry = name + '=' + state.blobs.at(blob_name(name)) + ';';
    names.add(entry.data(), entry.size());
  }
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(names.value())};
  std::vector<std::int64_t> every(static_cast<std::size_t>(world));
  comm.launch(comm.all_gather(Buffer(mine), Buffer(every))).get();
  for (int r = 0; r < comm.size(); ++r) {
    if (every[static_cast<std::size_t>(r)] != every[0]) {
      throw Error(Errc::size_mismatch,
                  fmt::format("the checkpoint of step {} on rank {} holds other replicated "
                              "tensors than rank 0's (names, types or shapes)",
                              state.step, r),
                  {.rank = comm.rank(), .operation = "restore"});
    }
  }
  for (const std::string& name : state.replicated) {
    at::Tensor whole = described(state.blobs.at(blob_name(name)));
    const std::int64_t chunk = chunk_of(whole.numel(), world);
    // Every share padded to `chunk`, gathered in rank order: the tensor flattened.
    at::Tensor share = at::zeros({chunk}, whole.options());
    const at::Tensor mine = state.tensors.at(name);
    if (mine.numel() > 0) share.narrow(0, 0, mine.numel()).copy_(mine);
    at::Tensor gathered = at::empty({chunk * world}, whole.options());
    comm.launch(comm.all_gather(as_buffer(share), as_buffer(gathered))).get();
    whole.view(-1).copy_(gathered.narrow(0, 0, whole.numel()));
    state.tensors[name] = std::move(whole);
    state.blobs.erase(blob_name(name));
  }
  state.replicated.clear();
}

TrainingState join(std::vector<TrainingState> shares, int own_from) {
  const TrainingState& first = shares.front();
  const TrainingState& owner = shares.at(static_cast<std::size_t>(std::max(own_from, 0)));
  TrainingState whole{.step = first.step, .tensors = {}, .blobs = owner.blobs, .replicated = {}};
  for (const auto& [name, tensor] : owner.tensors) {
    if (owner.replicated.contains(name)) continue;
    if (own_from < 0) {
      throw Error(Errc::invalid_argument,
                  fmt::format("the checkpoint of step {} holds rank 0's own '{}' (a shard), which "
                              "a job of {} rank(s) cannot be split another way",
                              first.step, name, shares.size()),
                  {.operation = "restore"});
    }
    whole.tensors[name] = tensor;
  }
  for (const std::string& name : first.replicated) {
    at::Tensor joined = described(first.blobs.at(blob_name(name)));
    std::int64_t at = 0;
    for (std::size_t r = 0; r < shares.size(); ++r) {
      const auto found = shares[r].tensors.find(name);
      const std::int64_t n = found == shares[r].tensors.end() ? -1 : found->second.numel();
      if (n < 0 || at + n > joined.numel()) {
        throw Error(Errc::size_mismatch,
                    fmt::format("the checkpoint of step {}: rank {}'s share of '{}' does not fit "
                                "the tensor rank 0 describes",
                                first.step, r, name),
                    {.operation = "restore"});
      }
      joined.view(-1).narrow(0, at, n).copy_(found->second.reshape(-1));
      at += n;
    }
    if (at != joined.numel()) {
      throw Error(Errc::size_mismatch,
                  fmt::format("the checkpoint of step {}: the shares of '{}' hold {} of its {} "
                              "elements",
                              first.step, name, at, joined.numel()),
                  {.operation = "restore"});
    }
    whole.tensors[name] = std::move(joined);
    whole.blobs.erase(blob_name(name));
  }
  return whole;
}

}  // namespace braid::torch::replicated_shares
