// A rank that cuda_process_test runs under braid-run: two processes on one GPU, moving
// CUDA buffers through the UCX communicator (staged through pinned host memory where UCX
// has no CUDA support): send/recv, a pipelined all_reduce of many chunks, broadcast and
// all_gather. Prints "rank R ok (staged|direct)", or the first mismatch on stderr with
// exit code 1; other errors with exit code 2.
#include <iostream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <braid/braid.hpp>
#include <braid/collectives/communicator.hpp>

namespace {

using braid::Buffer;
using braid::DType;
using braid::MemoryKind;
using braid::ReduceOp;
using braid::asio::awaitable;
using braid::collectives::Communicator;

class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& values) : count_(values.size()) {
    BRAID_CUDA_CHECK(cudaMalloc(&data_, std::max<std::size_t>(1, count_ * sizeof(float))));
    BRAID_CUDA_CHECK(
        cudaMemcpy(data_, values.data(), count_ * sizeof(float), cudaMemcpyHostToDevice));
  }
  ~DeviceFloats() { (void)cudaFree(data_); }
  Buffer buffer() const { return Buffer(data_, count_, DType::f32, MemoryKind::cuda, 0); }
  std::vector<float> download() const {
    std::vector<float> values(count_);
    BRAID_CUDA_CHECK(
        cudaMemcpy(values.data(), data_, count_ * sizeof(float), cudaMemcpyDeviceToHost));
    return values;
  }

 private:
  std::size_t count_;
  void* data_ = nullptr;
};

std::string first_difference(const std::vector<float>& got, const std::vector<float>& expected,
                             const std::string& what) {
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (got[i] != expected[i]) {
      return fmt::format("{}: element {} is {}, expected {}", what, i, got[i], expected[i]);
    }
  }
  return "";
}

awaitable<std::string> check(Communicator& comm) {
  const int rank = comm.rank();
  const int P = comm.size();
  // 8 MiB point to point, rank 0 to rank 1.
  std::vector<float> message(std::size_t{2} << 20);
  for (std::size_t i = 0; i < message.size(); ++i) message[i] = static_cast<float>(i % 1000);
  if (rank == 0) {
    DeviceFloats sent(message);
    co_await comm.send(sent.buffer(), 1);
  } else if (rank == 1) {
    DeviceFloats inbox(std::vector<float>(message.size(), -1.0F));
    const std::size_t got = co_await comm.recv(inbox.buffer(), 0);
    if (got != message.size()) co_return fmt::format("recv got {} elements", got);
    if (auto d = first_difference(inbox.download(), message, "recv"); !d.empty()) co_return d;
  }
  // 20 MiB all_reduce: many staging chunks through the pipeline.
  std::vector<float> mine(std::size_t{5} << 20);
  std::vector<float> sum(mine.size());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    mine[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 7));
    sum[i] = static_cast<float>(P * (P + 1) / 2 + P * static_cast<int>(i % 7));
  }
  DeviceFloats reduced(mine);
  co_await comm.all_reduce(reduced.buffer(), ReduceOp::sum);
  if (auto d = first_difference(reduced.download(), sum, "all_reduce"); !d.empty()) co_return d;
  // broadcast from the last rank; all_gather of one block each.
  DeviceFloats broadcast(std::vector<float>(3000, static_cast<float>(rank)));
  co_await comm.broadcast(broadcast.buffer(), P - 1);
  if (auto d = first_difference(broadcast.download(),
                                std::vector<float>(3000, static_cast<float>(P - 1)), "broadcast");
      !d.empty()) {
    co_return d;
  }
  DeviceFloats block(std::vector<float>(1000, static_cast<float>(rank)));
  DeviceFloats gathered(std::vector<float>(1000 * static_cast<std::size_t>(P), -1.0F));
  co_await comm.all_gather(block.buffer(), gathered.buffer());
  std::vector<float> expected;
  for (int r = 0; r < P; ++r) expected.insert(expected.end(), 1000, static_cast<float>(r));
  co_return first_difference(gathered.download(), expected, "all_gather");
}

}  // namespace

int main() {
  try {
    BRAID_CUDA_CHECK(cudaSetDevice(0));
    braid::Runtime runtime;
    auto world = braid::transport::World::join(runtime);
    auto comm = Communicator::world(*world);
    const std::string mismatch = runtime.spawn(check(*comm)).get();
    if (!mismatch.empty()) {
      std::cerr << "rank " << comm->rank() << ": " << mismatch << "\n";
      return 1;
    }
    std::cout << "rank " << comm->rank() << " ok ("
              << (world->transport().moves_cuda_memory() ? "direct" : "staged") << ")\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
