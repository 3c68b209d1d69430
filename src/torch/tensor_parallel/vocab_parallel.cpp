#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <braid/core/error.hpp>
#include <braid/torch/tensor_parallel/vocab_parallel.hpp>
#include <braid/trace/compute_span.hpp>

#include "torch/tensor_collectives.hpp"

namespace braid::torch {
namespace {

using collectives::Communicator;
using ::torch::Tensor;
using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

[[noreturn]] void refuse(const Communicator& comm, const char* operation, std::string what) {
  throw Error(Errc::invalid_argument, std::move(what),
              {.rank = comm.world_rank(comm.rank()), .operation = operation});
}

// Ids every rank sees (the TP ranks of a model replica take the same batch), so a bad id
// fails every rank alike, before any collective.
void check_ids(const Communicator& comm, const char* operation, const Tensor& ids,
               std::int64_t vocabulary) {
  if (ids.scalar_type() != ::torch::kLong && ids.scalar_type() != ::torch::kInt) {
    refuse(
        comm, operation,
        fmt::format("token ids must be int64 or int32, not {}", c10::toString(ids.scalar_type())));
  }
  if (ids.numel() == 0) return;
  const std::int64_t low = ids.min().item<std::int64_t>();
  const std::int64_t high = ids.max().item<std::int64_t>();
  if (low < 0 || high >= vocabulary) {
    refuse(comm, operation,
           fmt::format("token ids range over [{}, {}], outside the vocabulary [0, {})", low, high,
                       vocabulary));
  }
}

// The cross-entropy of vocabulary-split logits (see the header): forward all-reduces the
// maximum, then the target logit and the sum of exponentials in one; backward is local.
struct VocabParallelCrossEntropy : ::torch::autograd::Function<VocabParallelCrossEntropy> {
  static Tensor forward(AutogradContext* ctx, const Tensor& logits, const Tensor& targets,
                        std::shared_ptr<Communicator> comm) {
    const bool narrow =
        logits.scalar_type() == ::torch::kHalf || logits.scalar_type() == ::torch::kBFloat16;
    const Tensor x = narrow ? logits.to(::torch::kFloat) : logits;
    const std::int64_t part = x.size(-1);
    const std::int64_t start = part * comm->rank();
    const Tensor max = detail::reduce_over_ranks(*comm, x.amax(-1), ReduceOp::max);
    const Tensor shifted = x - max.unsqueeze(-1);
    const Tensor outside = (targets < start).logical_or(targets >= start + part);
    const Tensor local_targets = (targets - start).masked_fill(outside, 0).to(::torch::kLong);
    const Tensor predicted =
        shifted.gather(-1, local_targets.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0);
    const Tensor exp = shifted.exp();
    const Tensor sums = detail::reduce_over_ranks(*comm, ::torch::stack({predicted, exp.sum(-1)}));
    const Tensor sum_exp = sums[1];
    Tensor loss = sum_exp.log() - sums[0];
    exp.div_(sum_exp.unsqueeze(-1));  // now the softmax, kept for backward
    ctx->save_for_backward({exp, outside, local_targets});
    ctx->saved_data["dtype"] = static_cast<std::int64_t>(logits.scalar_type());
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor& softmax = saved[0];
    const Tensor& outside = saved[1];
    const Tensor& local_targets = saved[2];
    Tensor grad = softmax.clone();
    // Minus one at the target's logit, on the rank that holds it.
    grad.scatter_add_(-1, local_targets.unsqueeze(-1),
                      (outside.to(grad.scalar_type()) - 1).unsqueeze(-1));
    grad.mul_(grads[0].unsqueeze(-1));
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), Tensor(), Tensor()};
  }
};

}  // namespace

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(tp::TensorParallelGroup tp,
                                                       VocabParallelEmbeddingOptions options)
    : tp_(std::move(tp)), options_(options) {
  if (options_.num_embeddings < 1 || options_.num_embeddings % tp_->size() != 0 ||
      options_.dim < 1 || !(options_.init_std > 0)) {
    refuse(
        *tp_, "VocabParallelEmbedding",
        fmt::format("num_embeddings {} must be positive and divide by the tensor-parallel "
                    "degree {} (pad the vocabulary), and dim {} and init_std {} must be positive",
                    options_.num_embeddings, tp_->size(), options_.dim, options_.init_std));
  }
  reset();
}

std::int64_t VocabParallelEmbeddingImpl::vocab_start() const noexcept {
  return options_.num_embeddings / tp_->size() * tp_->rank();
}

std::int64_t VocabParallelEmbeddingImpl::vocab_end() const noexcept {
  return vocab_start() + options_.num_embeddings / tp_->size();
}

void VocabParallelEmbeddingImpl::reset() {
  ::torch::NoGradGuard no_grad;
  at::Generator generator = at::detail::createCPUGenerator(options_.seed);
  const Tensor full = ::torch::empty({options_.num_embeddings, options_.dim})
                          .normal_(0, options_.init_std, generator);
  weight = register_parameter("weight",
                              full.narrow(0, vocab_start(), vocab_end() - vocab_start()).clone());
}

void VocabParallelEmbeddingImpl::load_full(const Tensor& full) {
  if (full.sizes().vec() != std::vector<std::int64_t>{options_.num_embeddings, options_.dim}) {
    refuse(*tp_, "VocabParallelEmbedding",
           fmt::format("load_full: the full table has shape [{}], expected [{}, {}]",
                       fmt::join(full.sizes(), ", "), options_.num_embeddings, options_.dim));
  }
  ::torch::NoGradGuard no_grad;
  weight.copy_(full.narrow(0, vocab_start(), vocab_end() - vocab_start()));
}

Tensor VocabParallelEmbeddingImpl::forward(const Tensor& tokens) {
  check_ids(*tp_, "VocabParallelEmbedding", tokens, options_.num_embeddings);
  trace::ComputeSpan span("tp.vocab_embedding.forward");
  const Tensor outside = (tokens < vocab_start()).logical_or(tokens >= vocab_end());
  const Tensor local = (tokens - vocab_start()).masked_fill(outside, 0).to(::torch::kLong);
  const Tensor partial = ::torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0);
  span.end();
  return options_.sequence_parallel && tp_->size() > 1
             ? tp::reduce_scatter_to_sequence_region(tp_, partial)
             : tp::reduce_from_region(tp_, partial);
}

Tensor vocab_parallel_cross_entropy(tp::TensorParallelGroup tp, const Tensor& logits,
                                    const Tensor& targets) {
  constexpr const char* operation = "vocab_parallel_cross_entropy";
  if (logits.dim() < 1 || targets.sizes() != logits.sizes().slice(0, logits.dim() - 1)) {
    refuse(*tp, operation,
           fmt::format("targets of shape [{}] for logits of shape [{}]: the targets' shape must "
                       "be the logits' without the last dimension",
                       fmt::join(targets.sizes(), ", "), fmt::join(logits.sizes(), ", ")));
  }
  check_ids(*tp, operation, targets, logits.size(-1) * tp->size());
  return VocabParallelCrossEntropy::apply(logits, targets, std::move(tp));
}

}  // namespace braid::torch
