#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/tensor_parallel/parallel_transformer_block.hpp>
#include <braid/trace/compute_span.hpp>

namespace braid::torch {
namespace {

using ::torch::Tensor;

[[noreturn]] void refuse(const collectives::Communicator& comm, std::string what) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = "ParallelTransformerBlock"});
}

// The block's layers, each drawing its weights from its own seed.
enum Layer : std::uint64_t { kQkv = 1, kProj, kFc1, kFc2 };

// A layer's seed, mixed from the block's (splitmix64's finaliser over seed and layer), so
// blocks with neighbouring seeds (a stack seeded 0, 1, 2, ...) share no weights, as they
// would with seeds a fixed offset apart.
std::uint64_t layer_seed(std::uint64_t block_seed, Layer layer) {
  std::uint64_t z = block_seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(layer);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

ParallelTransformerBlockImpl::ParallelTransformerBlockImpl(tp::TensorParallelGroup tp,
                                                           ParallelTransformerBlockOptions options)
    : tp_(std::move(tp)), options_(options) {
  if (options_.ffn_hidden == 0) options_.ffn_hidden = 4 * options_.hidden;
  const int t = tp_->size();
  if (options_.hidden < 1 || options_.heads < 1 || options_.hidden % options_.heads != 0 ||
      options_.heads % t != 0 || options_.ffn_hidden % t != 0) {
    refuse(*tp_, fmt::format("hidden {} must divide by heads {}, and heads and ffn_hidden {} by "
                             "the tensor-parallel degree {}",
                             options_.hidden, options_.heads, options_.ffn_hidden, t));
  }
  reset();
}

void ParallelTransformerBlockImpl::reset() {
  const auto& o = options_;
  const ::torch::nn::LayerNormOptions norm =
      ::torch::nn::LayerNormOptions({o.hidden}).eps(o.layer_norm_eps);
  ln1 = register_module("ln1", ::torch::nn::LayerNorm(norm));
  qkv = register_module(
      "qkv", ColumnParallelLinear(
                 tp_, ColumnParallelLinearOptions{.in_features = o.hidden,
                                                  .out_features = 3 * o.hidden,
                                                  .sequence_parallel = o.sequence_parallel,
                                                  .overlap_grad_reduce = o.overlap_grad_reduce,
                                                  .seed = layer_seed(o.seed, kQkv)}));
  proj = register_module(
      "proj",
      RowParallelLinear(tp_, RowParallelLinearOptions{.in_features = o.hidden,
                                                      .out_features = o.hidden,
                                                      .sequence_parallel = o.sequence_parallel,
                                                      .seed = layer_seed(o.seed, kProj)}));
  ln2 = register_module("ln2", ::torch::nn::LayerNorm(norm));
  fc1 = register_module(
      "fc1", ColumnParallelLinear(
                 tp_, ColumnParallelLinearOptions{.in_features = o.hidden,
                                                  .out_features = o.ffn_hidden,
                                                  .sequence_parallel = o.sequence_parallel,
                                                  .overlap_grad_reduce = o.overlap_grad_reduce,
                                                  .seed = layer_seed(o.seed, kFc1)}));
  fc2 = register_module("fc2", RowParallelLinear(tp_, RowParallelLinearOptions{
                                                          .in_features = o.ffn_hidden,
                                                          .out_features = o.hidden,
                                                          .sequence_parallel = o.sequence_parallel,
                                                          .seed = layer_seed(o.seed, kFc2)}));
}

Tensor ParallelTransformerBlockImpl::attention(const Tensor& qkv_out) const {
  // [s, b, heads/t * 3 * d] -> q, k, v: [b, heads/t, s, d]
  trace::ComputeSpan span("tp.attention.forward");
  const std::int64_t s = qkv_out.size(0), b = qkv_out.size(1);
  const std::int64_t d = options_.hidden / options_.heads;
  const std::int64_t local_heads = options_.heads / tp_->size();
  const Tensor split = qkv_out.view({s, b, local_heads, 3, d}).permute({3, 1, 2, 0, 4});
  const Tensor q = split[0], k = split[1], v = split[2];
  Tensor scores = ::torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
  const Tensor future =
      ::torch::ones({s, s}, ::torch::TensorOptions().dtype(::torch::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  const Tensor context = ::torch::matmul(::torch::softmax(scores, -1), v);  // [b, h/t, s, d]
  return context.permute({2, 0, 1, 3}).reshape({s, b, local_heads * d});
}

Tensor ParallelTransformerBlockImpl::forward(const Tensor& x) {
  if (x.dim() != 3 || x.size(2) != options_.hidden) {
    refuse(*tp_, fmt::format("input of shape [{}] is not [s, b, {}]", fmt::join(x.sizes(), ", "),
                             options_.hidden));
  }
  Tensor h = x + proj(attention(qkv(ln1(x))));
  return h + fc2(::torch::gelu(fc1(ln2(h))));
}

std::vector<Tensor> ParallelTransformerBlockImpl::sequence_parallel_parameters() const {
  if (!options_.sequence_parallel || tp_->size() == 1) return {};
  std::vector<Tensor> replicated = {ln1->weight, ln1->bias, ln2->weight, ln2->bias};
  for (const auto* row : {&proj, &fc2}) {
    for (const Tensor& p : (*row)->sequence_parallel_parameters()) replicated.push_back(p);
  }
  return replicated;
}

std::map<std::string, std::int64_t> ParallelTransformerBlockImpl::parameter_partition_dims() const {
  std::map<std::string, std::int64_t> dims;
  for (const auto& named : named_parameters()) dims[named.key()] = -1;
  dims["qkv.weight"] = dims["qkv.bias"] = ColumnParallelLinearImpl::weight_partition_dim;
  dims["fc1.weight"] = dims["fc1.bias"] = ColumnParallelLinearImpl::weight_partition_dim;
  dims["proj.weight"] = dims["fc2.weight"] = RowParallelLinearImpl::weight_partition_dim;
  return dims;
}

}  // namespace braid::torch
