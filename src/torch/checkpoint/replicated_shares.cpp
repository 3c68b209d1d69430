#include "replicated_shares.hpp"

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <braid/core/buffer.hpp>
#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/torch/tensor_buffer.hpp>

#include "checkpoint_format.hpp"

namespace braid::torch::replicated_shares {
namespace {

// The blob beside a share: "<scalar type>;<sizes>" of the whole tensor.
constexpr std::string_view kPrefix = "replicated:";

std::string blob_name(const std::string& tensor) {
  return std::string(kPrefix) + tensor;
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
    const std::int64_t chunk = (flat.numel() + world - 1) / world;
    const std::int64_t begin = std::min(flat.numel(), chunk * rank);
    held.tensors[name] = flat.narrow(0, begin, std::min(chunk, flat.numel() - begin));
    held.blobs[blob_name(name)] = fmt::format("{};{}", static_cast<int>(tensor.scalar_type()),
                                              fmt::join(tensor.sizes(), ","));
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
    const std::string shape = state.blobs.at(blob_name(name));
    const auto semicolon = shape.find(';');
    const auto type = static_cast<c10::ScalarType>(
        config::parse_int(std::string_view(shape).substr(0, semicolon), "a share's type"));
    std::vector<std::int64_t> sizes;
    for (std::string_view rest = std::string_view(shape).substr(semicolon + 1); !rest.empty();) {
      const auto comma = rest.find(',');
      sizes.push_back(config::parse_int(rest.substr(0, comma), "a share's shape"));
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
    at::Tensor whole = at::empty(sizes, at::TensorOptions().dtype(type));
    const std::int64_t chunk = (whole.numel() + world - 1) / world;
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

}  // namespace braid::torch::replicated_shares
