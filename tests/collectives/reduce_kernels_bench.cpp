// Throughput of the reduction kernels next to memcpy's, for the figures in
// <braid/collectives/reduce_kernels.hpp>. Sum of each dtype on 4 MiB operands, out of place
// (dst = a + b) and in place (a += b, what all-reduce does); GB/s counts the bytes of
// dst + a + b, memcpy's its source + destination. Each figure is the best of several timed
// rounds, since other processes share the machine.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include <braid/collectives/reduce_kernels.hpp>

namespace {

using braid::DType;
using braid::ReduceOp;
namespace collectives = braid::collectives;

constexpr std::size_t kOperandBytes = std::size_t{4} << 20;
constexpr int kRounds = 15;
constexpr int kCallsPerRound = 20;

template <class Call>
double best_gigabytes_per_second(std::size_t bytes_per_call, Call call) {
  call();  // fault the pages in and warm the caches
  double best_seconds = 1e30;
  for (int round = 0; round < kRounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCallsPerRound; ++i) call();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    best_seconds = std::min(best_seconds, elapsed.count());
  }
  return static_cast<double>(bytes_per_call) * kCallsPerRound / best_seconds / 1e9;
}

// Ordinary finite values (small integers) in the dtype's encoding, so no kernel meets NaN,
// infinities or subnormals, which can be slow on some CPUs.
std::vector<std::byte> operand(DType dtype, int seed) {
  const std::size_t count = kOperandBytes / braid::dtype_size(dtype);
  std::vector<std::byte> bytes(kOperandBytes);
  for (std::size_t i = 0; i < count; ++i) {
    const int value = static_cast<int>((i * 7 + static_cast<std::size_t>(seed)) % 13) - 6;
    std::byte* element = bytes.data() + i * braid::dtype_size(dtype);
    auto store = [element](auto typed) { std::memcpy(element, &typed, sizeof typed); };
    switch (dtype) {
      case DType::f32:
        store(static_cast<float>(value));
        break;
      case DType::f64:
        store(static_cast<double>(value));
        break;
      case DType::f16:
        store(collectives::f32_to_f16(static_cast<float>(value)));
        break;
      case DType::bf16:
        store(collectives::f32_to_bf16(static_cast<float>(value)));
        break;
      case DType::i32:
        store(static_cast<std::int32_t>(value));
        break;
      case DType::i64:
        store(static_cast<std::int64_t>(value));
        break;
      case DType::u8:
        store(static_cast<std::uint8_t>(value + 6));
        break;
    }
  }
  return bytes;
}

}  // namespace

int main() {
  fmt::print("reduce sum, {} MiB per operand, GB/s of dst + a + b\n", kOperandBytes >> 20);
  fmt::print("{:<6}{:>10}{:>10}\n", "dtype", "dst=a+b", "a+=b");
  for (DType dtype :
       {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    std::vector<std::byte> a = operand(dtype, 1);
    std::vector<std::byte> b = operand(dtype, 2);
    std::vector<std::byte> dst(kOperandBytes);
    const std::size_t count = kOperandBytes / braid::dtype_size(dtype);
    const double out_of_place = best_gigabytes_per_second(3 * kOperandBytes, [&] {
      collectives::reduce(dst.data(), a.data(), b.data(), count, dtype, ReduceOp::sum);
    });
    // a grows each call; for floats and wrapping integers that is harmless to the timing.
    const double in_place = best_gigabytes_per_second(3 * kOperandBytes, [&] {
      collectives::reduce(a.data(), a.data(), b.data(), count, dtype, ReduceOp::sum);
    });
    fmt::print("{:<6}{:>10.1f}{:>10.1f}\n", braid::to_string(dtype), out_of_place, in_place);
  }
  std::vector<std::byte> source = operand(DType::u8, 1);
  std::vector<std::byte> destination(kOperandBytes);
  const double copy = best_gigabytes_per_second(
      2 * kOperandBytes, [&] { std::memcpy(destination.data(), source.data(), kOperandBytes); });
  fmt::print("memcpy{:>10.1f}   (GB/s of source + destination)\n", copy);
}
