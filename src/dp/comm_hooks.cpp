// The built-in comm hooks (comm_hook.hpp). Each converts, quantises or factors a bucket on
// the runtime thread; the arithmetic is plain loops (f32), which run at memory speed for
// the conversions and at a few GFLOP/s for PowerSGD's n x m x r products -- small next to
// the backward pass whose gradients they carry.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include <fmt/format.h>

#include <braid/collectives/reduce_kernels.hpp>
#include <braid/core/error.hpp>
#include <braid/dp/comm_hook.hpp>

namespace braid::dp {
namespace {

using collectives::Communicator;

float* floats(const Buffer& b) {
  return static_cast<float*>(b.data());
}

class AllReduceHook final : public CommHook {
 public:
  std::string_view name() const noexcept override { return "all_reduce"; }
  bool single_collective() const noexcept override { return true; }
  bool averages() const noexcept override { return true; }
  bool runs_on_device() const noexcept override { return true; }
  asio::awaitable<void> reduce(Communicator& comm, BucketView bucket) override {
    co_await comm.all_reduce(bucket.data, bucket.combine);
  }
};

// The compressing hooks work on f32 buckets; buckets of other dtypes are reduced exactly.
class Float32Hook : public CommHook {
 public:
  asio::awaitable<void> reduce(Communicator& comm, BucketView bucket) final {
    if (bucket.data.dtype() != DType::f32) {
      co_await comm.all_reduce(bucket.data, bucket.combine);
    } else {
      co_await reduce_f32(comm, bucket);
    }
  }

 protected:
  virtual asio::awaitable<void> reduce_f32(Communicator& comm, BucketView bucket) = 0;
};

class CompressHook final : public Float32Hook {
 public:
  explicit CompressHook(DType wire) : wire_(wire) {
    if (wire != DType::f16 && wire != DType::bf16) {
      throw Error(
          Errc::invalid_argument,
          fmt::format("compress_hook: the wire type must be f16 or bf16, not {}", to_string(wire)),
          {.operation = "compress_hook"});
    }
  }
  std::string_view name() const noexcept override {
    return wire_ == DType::f16 ? "compress_f16" : "compress_bf16";
  }
  bool runs_on_device() const noexcept override { return true; }
  void buckets_rebuilt() override { device_wire_.clear(); }
  asio::awaitable<void> reduce_f32(Communicator& comm, BucketView bucket) override {
    if (bucket.device != nullptr) {
      co_await reduce_on_device(comm, bucket);
      co_return;
    }
    const std::size_t n = bucket.data.count();
    std::vector<std::uint16_t> wire(n);
    const float* values = floats(bucket.data);
    const bool half = wire_ == DType::f16;
    for (std::size_t i = 0; i < n; ++i) {
      wire[i] = half ? collectives::f32_to_f16(values[i]) : collectives::f32_to_bf16(values[i]);
    }
    co_await comm.all_reduce(Buffer(wire.data(), n, wire_), ReduceOp::sum);
    float* out = floats(bucket.data);
    for (std::size_t i = 0; i < n; ++i) {
      out[i] = half ? collectives::f16_to_f32(wire[i]) : collectives::bf16_to_f32(wire[i]);
    }
  }

 private:
  // The conversions are kernels on the bucket's reduction stream, which the wire buffer's
  // all-reduce follows; the wire memory is kept per bucket (allocating device memory
  // synchronises the device).
  asio::awaitable<void> reduce_on_device(Communicator& comm, BucketView bucket) {
    BucketDevice& device = *bucket.device;
    Stream& stream = *bucket.data.stream();
    const std::size_t n = bucket.data.count();
    std::shared_ptr<std::byte[]>& memory = device_wire_[bucket.index];
    if (!memory) memory = device.allocate(n * dtype_size(wire_));
    const Buffer wire =
        Buffer(memory.get(), n, wire_, MemoryKind::cuda, device.device()).on_stream(&stream);
    device.convert(wire, bucket.data, 1.0, stream);
    co_await comm.all_reduce(wire, ReduceOp::sum);
    device.convert(bucket.data, wire, 1.0, stream);
  }

  DType wire_;
  std::map<std::size_t, std::shared_ptr<std::byte[]>> device_wire_;  // by bucket index
};

// 8-bit: v = bucket + residual; every rank uses the same scale s = max over ranks of
// max|v| (one 4-byte all-reduce); q = round(v / s * 127) in [-127, 127] travels as a byte
// (offset by 128) in an all-gather; every rank sums the dequantised vectors in rank order,
// so all get the same result. residual = v - q * s / 127, at most s / 254 per element.
class Quantize8Hook final : public Float32Hook {
 public:
  std::string_view name() const noexcept override { return "quantize_8bit"; }
  void buckets_rebuilt() override { residuals_.clear(); }
  asio::awaitable<void> reduce_f32(Communicator& comm, BucketView bucket) override {
    const std::size_t n = bucket.data.count();
    std::vector<float>& kept = residuals_[bucket.index];
    if (kept.size() != n) kept.assign(n, 0.0f);
    // A shadow (zeros) feeds back nothing and leaves the residual for the next real step.
    std::vector<float> nothing;
    if (bucket.shadow) nothing.assign(n, 0.0f);
    std::vector<float>& residual = bucket.shadow ? nothing : kept;
    float* v = floats(bucket.data);
    float local_max = 0;
    for (std::size_t i = 0; i < n; ++i) {
      v[i] += residual[i];
      local_max = std::max(local_max, std::abs(v[i]));
    }
    std::vector<float> scale{local_max};
    co_await comm.all_reduce(Buffer(scale), ReduceOp::max);
    const float s = scale[0] > 0 ? scale[0] : 1.0f;
    std::vector<std::uint8_t> mine(n);
    for (std::size_t i = 0; i < n; ++i) {
      const float q = std::clamp(std::nearbyint(v[i] / s * 127.0f), -127.0f, 127.0f);
      mine[i] = static_cast<std::uint8_t>(static_cast<int>(q) + 128);
      residual[i] = v[i] - q * s / 127.0f;
    }
    std::vector<std::uint8_t> all(n * static_cast<std::size_t>(comm.size()));
    co_await comm.all_gather(Buffer(mine.data(), n, DType::u8),
                             Buffer(all.data(), all.size(), DType::u8));
    std::fill(v, v + n, 0.0f);
    for (int r = 0; r < comm.size(); ++r) {
      const std::uint8_t* q = all.data() + static_cast<std::size_t>(r) * n;
      for (std::size_t i = 0; i < n; ++i)
        v[i] += static_cast<float>(static_cast<int>(q[i]) - 128) * s / 127.0f;
    }
  }

 private:
  std::map<std::size_t, std::vector<float>> residuals_;
};

// Gram-Schmidt on the columns of an n x r row-major matrix.
void orthonormalise(std::vector<float>& p, std::size_t n, std::size_t r) {
  for (std::size_t j = 0; j < r; ++j) {
    for (std::size_t k = 0; k < j; ++k) {
      double dot = 0;
      for (std::size_t i = 0; i < n; ++i) dot += double{p[i * r + j]} * p[i * r + k];
      for (std::size_t i = 0; i < n; ++i) p[i * r + j] -= static_cast<float>(dot) * p[i * r + k];
    }
    double norm = 0;
    for (std::size_t i = 0; i < n; ++i) norm += double{p[i * r + j]} * p[i * r + j];
    norm = std::sqrt(norm);
    const float inverse = norm > 1e-12 ? static_cast<float>(1.0 / norm) : 0.0f;
    for (std::size_t i = 0; i < n; ++i) p[i * r + j] *= inverse;
  }
}

class PowerSgdHook final : public Float32Hook {
 public:
  PowerSgdHook(int rank, std::uint64_t seed) : rank_(static_cast<std::size_t>(rank)), seed_(seed) {
    if (rank < 1) {
      throw Error(Errc::invalid_argument, fmt::format("power_sgd_hook: rank {} < 1", rank),
                  {.operation = "power_sgd_hook"});
    }
  }
  std::string_view name() const noexcept override { return "power_sgd"; }
  void buckets_rebuilt() override { state_.clear(); }

  asio::awaitable<void> reduce_f32(Communicator& comm, BucketView bucket) override {
    float* data = floats(bucket.data);
    const BucketLayout& layout = *bucket.layout;
    std::vector<float>& kept = state_[bucket.index].error;
    if (kept.size() != bucket.data.count()) kept.assign(bucket.data.count(), 0.0f);
    // A shadow (zeros) feeds back nothing and leaves the error for the next real step; the
    // warm-start Q is the ranks' common one and is updated as always.
    std::vector<float> nothing;
    if (bucket.shadow) nothing.assign(kept.size(), 0.0f);
    std::vector<float>& error = bucket.shadow ? nothing : kept;
    for (std::size_t i = 0; i < error.size(); ++i) data[i] += error[i];

    // Which parameters are compressed, and where their factors go in two flat buffers.
    struct Matrix {
      std::size_t offset, n, m, p_at, q_at;
    };
    std::vector<Matrix> matrices;
    std::vector<std::uint8_t> compressed(bucket.data.count(), 0);
    std::size_t p_total = 0;
    std::size_t q_total = 0;
    for (std::size_t k = 0; k < layout.parameters.size(); ++k) {
      const ParameterSpec& spec = bucket.parameters[layout.parameters[k]];
      if (spec.shape.size() < 2) continue;
      const auto n = static_cast<std::size_t>(spec.shape[0]);
      const std::size_t m = spec.count / std::max<std::size_t>(n, 1);
      if (std::min(n, m) <= rank_) continue;
      matrices.push_back({layout.offsets[k], n, m, p_total, q_total});
      p_total += n * rank_;
      q_total += m * rank_;
      std::fill(compressed.begin() + static_cast<std::ptrdiff_t>(layout.offsets[k]),
                compressed.begin() + static_cast<std::ptrdiff_t>(layout.offsets[k] + spec.count),
                1);
    }
    std::vector<float>& q = state_[bucket.index].q;
    if (q.size() != q_total) {  // first use: the same random Q on every rank
      q.resize(q_total);
      std::mt19937_64 random(seed_ + bucket.index);
      std::normal_distribution<float> normal;
      for (float& x : q) x = normal(random);
    }
    // The rest travels exactly, packed next to P.
    std::vector<float> rest;
    for (std::size_t i = 0; i < bucket.data.count(); ++i) {
      if (compressed[i] == 0) rest.push_back(data[i]);
    }
    std::vector<float> p(p_total + rest.size());
    for (const Matrix& a : matrices) {  // P = M Q
      const float* mat = data + a.offset;
      for (std::size_t i = 0; i < a.n; ++i) {
        for (std::size_t j = 0; j < rank_; ++j) {
          double sum = 0;
          for (std::size_t c = 0; c < a.m; ++c)
            sum += double{mat[i * a.m + c]} * q[a.q_at + c * rank_ + j];
          p[a.p_at + i * rank_ + j] = static_cast<float>(sum);
        }
      }
    }
    std::copy(rest.begin(), rest.end(), p.begin() + static_cast<std::ptrdiff_t>(p_total));
    if (!p.empty()) co_await comm.all_reduce(Buffer(p), ReduceOp::sum);
    for (const Matrix& a : matrices) {
      std::vector<float> block(p.begin() + static_cast<std::ptrdiff_t>(a.p_at),
                               p.begin() + static_cast<std::ptrdiff_t>(a.p_at + a.n * rank_));
      orthonormalise(block, a.n, rank_);
      std::copy(block.begin(), block.end(), p.begin() + static_cast<std::ptrdiff_t>(a.p_at));
      const float* mat = data + a.offset;  // Q = M^T P
      for (std::size_t c = 0; c < a.m; ++c) {
        for (std::size_t j = 0; j < rank_; ++j) {
          double sum = 0;
          for (std::size_t i = 0; i < a.n; ++i)
            sum += double{mat[i * a.m + c]} * block[i * rank_ + j];
          q[a.q_at + c * rank_ + j] = static_cast<float>(sum);
        }
      }
    }
    if (!q.empty()) co_await comm.all_reduce(Buffer(q), ReduceOp::sum);
    // M ~ P Q^T; the error is what the local M lost (before the sum, as PowerSGD does).
    std::size_t next_rest = p_total;
    for (std::size_t i = 0; i < bucket.data.count(); ++i) {
      if (compressed[i] == 0) {
        error[i] = 0;
        data[i] = p[next_rest++];
      }
    }
    for (const Matrix& a : matrices) {
      float* mat = data + a.offset;
      for (std::size_t i = 0; i < a.n; ++i) {
        for (std::size_t c = 0; c < a.m; ++c) {
          double approx = 0;
          for (std::size_t j = 0; j < rank_; ++j)
            approx += double{p[a.p_at + i * rank_ + j]} * q[a.q_at + c * rank_ + j];
          const std::size_t at = a.offset + i * a.m + c;
          error[at] =
              mat[i * a.m + c] - static_cast<float>(approx) / static_cast<float>(comm.size());
          mat[i * a.m + c] = static_cast<float>(approx);
        }
      }
    }
  }

 private:
  struct State {
    std::vector<float> q;
    std::vector<float> error;
  };
  std::size_t rank_;
  std::uint64_t seed_;
  std::map<std::size_t, State> state_;
};

}  // namespace

std::shared_ptr<CommHook> all_reduce_hook() {
  return std::make_shared<AllReduceHook>();
}
std::shared_ptr<CommHook> compress_hook(DType wire) {
  return std::make_shared<CompressHook>(wire);
}
std::shared_ptr<CommHook> quantize_8bit_hook() {
  return std::make_shared<Quantize8Hook>();
}
std::shared_ptr<CommHook> power_sgd_hook(int rank, std::uint64_t seed) {
  return std::make_shared<PowerSgdHook>(rank, seed);
}

}  // namespace braid::dp
