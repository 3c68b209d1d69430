// Reducer (<braid/dp/reducer.hpp>): construction, the buckets' layout and memory (built
// again in arrival order by reducer_finalize.cpp), gradients bound to them as views, and
// the settings: the comm hook and the batch share. reducer_internal.hpp lists the rest.
#include <memory>
#include <string>

#include <fmt/format.h>

#include <braid/dp/reducer.hpp>

#include "dp/reducer_internal.hpp"
#include "dp/scaled_copy.hpp"

namespace braid::dp {

using collectives::Communicator;
using detail::describe;
using detail::misuse;

Reducer::Reducer(std::shared_ptr<Communicator> comm, std::vector<ParameterSpec> parameters,
                 GradientAccess& access, Options options)
    : comm_(std::move(comm)),
      parameters_(std::move(parameters)),
      access_(access),
      options_(options),
      scale_(1.0 / comm_->size()),
      track_(trace::track("ddp buckets")),
      hook_(all_reduce_hook()) {
  const bool on_device = !parameters_.empty() && parameters_[0].memory == MemoryKind::cuda;
  if (on_device) {
    if (!options_.device) {
      misuse(*comm_, fmt::format("{} is in CUDA memory: its buckets need a device "
                                 "(Reducer::Options::device, dp::cuda_bucket_device)",
                                 describe(parameters_[0], 0)));
    }
    if (!comm_->accepts_cuda_buffers()) {
      misuse(*comm_, fmt::format("{} is in CUDA memory, which this communicator cannot move "
                                 "(braid built without CUDA)",
                                 describe(parameters_[0], 0)));
    }
    device_ = options_.device.get();
  }
  check_placement();
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const ParameterSpec& p = parameters_[i];
    if (p.dtype != DType::f32 && p.dtype != DType::f64 && p.dtype != DType::f16 &&
        p.dtype != DType::bf16) {
      misuse(*comm_, fmt::format("{} is {}; gradients must be floating point", describe(p, i),
                                 to_string(p.dtype)));
    }
  }
  ready_.assign(parameters_.size(), 0);
  locally_used_.assign(parameters_.size(), 1);
  build_buckets(reverse_order(parameters_.size()));
  bind_gradients();
}

void Reducer::check_placement() const {
  const auto where = [](MemoryKind memory, int device) {
    return memory == MemoryKind::host ? std::string("host memory")
                                      : fmt::format("CUDA device {}", device);
  };
  const std::string home =
      device_ != nullptr ? where(MemoryKind::cuda, device_->device()) : where(MemoryKind::host, -1);
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const ParameterSpec& p = parameters_[i];
    const bool at_home = device_ != nullptr
                             ? p.memory == MemoryKind::cuda && p.device == device_->device()
                             : p.memory == MemoryKind::host;
    if (!at_home) {
      misuse(*comm_, fmt::format("parameters on mixed devices: {} is on {} but {} is on {}; one "
                                 "DistributedDataParallel takes parameters on one device",
                                 describe(p, i), where(p.memory, p.device),
                                 describe(parameters_[0], 0), home));
    }
  }
}

void Reducer::copy_scaled(const Buffer& dst, const Buffer& src, double factor) {
  if (device_ != nullptr) {
    device_->convert(dst, src, factor, device_->producer());
  } else {
    detail::scaled_copy(dst, src, factor);
  }
}

void Reducer::clear(const Buffer& dst) {
  if (device_ != nullptr) {
    device_->zero(dst, device_->producer());
  } else {
    detail::zero(dst);
  }
}

void Reducer::bind_gradients() {
  if (!options_.gradient_as_bucket_view) return;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const Buffer slot = buckets_[bucket_of_[i]]->slot(slot_of_[i], parameters_[i].count);
    const std::optional<Buffer> current = access_.gradient(i, false);
    // A parameter with no gradient keeps none: optimizers skip it (no momentum, no weight
    // decay), as in copy mode and PyTorch's. fill_slot binds it once one arrives.
    if (!current) continue;
    if (current->count() == slot.count() && current->dtype() == slot.dtype()) {
      copy_scaled(slot, *current, 1.0);
    } else {
      clear(slot);
    }
    access_.bind_gradient(i, slot, buckets_[bucket_of_[i]]->storage);
  }
}

Reducer::~Reducer() {
  comm_->set_computing(false);
  // In-flight reductions still read and write the buckets: give them a bounded while.
  settle_reductions();
}

void Reducer::build_buckets(const std::vector<std::size_t>& ready_order) {
  buckets_.clear();
  bucket_of_.assign(parameters_.size(), 0);
  slot_of_.assign(parameters_.size(), 0);
  std::vector<BucketLayout> layouts = plan_buckets(parameters_, ready_order, options_.limits);
  // One allocation for every bucket (the same size on every rank, as the layouts are),
  // each bucket starting on a cache line of its own.
  constexpr std::size_t kAlignment = 64;
  std::vector<std::size_t> starts;
  std::size_t total = 0;
  for (const BucketLayout& layout : layouts) {
    starts.push_back(total);
    total += (layout.count * dtype_size(layout.dtype) + kAlignment - 1) / kAlignment * kAlignment;
  }
  std::shared_ptr<std::byte[]> memory = device_ != nullptr ? device_->allocate(total)
                                        : options_.shared_buckets
                                            ? comm_->launch(comm_->allocate_shared(total)).get()
                                            : std::make_shared<std::byte[]>(total);
  for (std::size_t b = 0; b < layouts.size(); ++b) {
    BucketLayout& layout = layouts[b];
    auto bucket = std::make_unique<Bucket>();
    // Aliases the allocation: it lives while any bucket or bound gradient does.
    bucket->storage = std::shared_ptr<std::byte[]>(memory, memory.get() + starts[b]);
    if (device_ != nullptr) {
      // Its collectives follow its reduction stream, which waits for the bucket's gradients.
      bucket->data = Buffer(bucket->storage.get(), layout.count, layout.dtype, MemoryKind::cuda,
                            device_->device())
                         .on_stream(&device_->reduction_stream(b));
      bucket->filled = bucket->data.stream()->make_event();
      bucket->reduced = bucket->data.stream()->make_event();
    } else {
      bucket->data = Buffer(bucket->storage.get(), layout.count, layout.dtype);
    }
    for (std::size_t position = 0; position < layout.parameters.size(); ++position) {
      bucket_of_[layout.parameters[position]] = buckets_.size();
      slot_of_[layout.parameters[position]] = position;
    }
    bucket->layout = std::move(layout);
    buckets_.push_back(std::move(bucket));
  }
}

std::size_t Reducer::bucket_count() const {
  return buckets_.size();
}

const BucketLayout& Reducer::bucket(std::size_t index) const {
  return buckets_.at(index)->layout;
}

void Reducer::set_comm_hook(std::shared_ptr<CommHook> hook) {
  std::lock_guard lock(mutex_);
  if (state_ == State::backward) misuse(*comm_, "set_comm_hook during a backward pass");
  if (!hook) misuse(*comm_, "set_comm_hook with no hook");
  if (device_ != nullptr && !hook->runs_on_device()) {
    misuse(*comm_, fmt::format("the {} comm hook reduces buckets in host memory; buckets in CUDA "
                               "memory take the all_reduce or compress hooks",
                               hook->name()));
  }
  hook_ = std::move(hook);
}

void Reducer::set_batch_share(double share) {
  if (!(share > 0.0 && share <= 1.0)) {
    misuse(*comm_, fmt::format("batch share {} is not in (0, 1]", share));
  }
  scale_ = share;
  equal_shares_ = false;
}

}  // namespace braid::dp
