// braid-bench's GPU modes (built with CUDA; they need a device to run):
//
//   nccl      NCCL all-reduce through braid's NcclCommunicator against ncclAllReduce called
//             directly, one rank, the same sizes, in interleaved rounds: time per
//             operation (each one completed before the next starts, as a training step
//             waits for its gradients), braid's overhead in percent and in microseconds.
//   cuda-p2p  two processes on this host moving CUDA buffers through the UCX communicator
//             (staged through pinned host memory where UCX has no CUDA support), beside
//             the same transfer of host buffers: the staging's bandwidth cost.
//
// How they measure:
// - nccl: both sides use the same device buffers and sizes. Direct: ncclAllReduce on a
//   blocking one-rank communicator (ncclCommInitAll) and a stream, then
//   cudaStreamSynchronize. braid: co_await NcclCommunicator::all_reduce, which waits on
//   the compute stream's event, enqueues, and polls its completion event. Rounds of
//   `iters` operations alternate between the two (so drifting clocks and thermals hit
//   both alike); each size reports the median round's time per operation.
// - cuda-p2p: rank 0 sends `iters` messages to rank 1, one at a time, and the clock stops
//   at rank 1's acknowledgement; once with cudaMalloc buffers, once with host buffers.
#include <algorithm>
#include <iostream>
#include <regex>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nccl.h>

#include <braid/braid.hpp>
#include <braid/collectives/communicator.hpp>
#include <braid/collectives/nccl_communicator.hpp>

#include "../harness/report.hpp"
#include "../harness/results.hpp"
#include "../harness/subprocess.hpp"
#include "modes.hpp"

namespace braid::bench {
namespace {

using asio::awaitable;
using collectives::Communicator;
using collectives::NcclCommunicator;

struct GpuOptions {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{256} << 20;
  int iterations = 0;  // 0: by size
  int rounds = 7;
  bool json = false;
  bool worker = false;
};

OptionTable table(GpuOptions& o) {
  return {bytes("--min-bytes", o.min_bytes, 4),
          bytes("--max-bytes", o.max_bytes),
          count("--rounds", o.rounds, 1, 1000),
          count("--iters", o.iterations, 0, 1000000000).noted("0: by size"),
          flag("--json", o.json),
          flag("--worker", o.worker).unlisted()};
}

void check(const GpuOptions& options) {
  if (options.min_bytes > options.max_bytes) {
    throw std::invalid_argument("need 4 <= --min-bytes <= --max-bytes");
  }
}

// Enough operations per round for ~20 ms of work, at least 5.
int iterations_for(const GpuOptions& options, std::size_t bytes) {
  if (options.iterations > 0) return options.iterations;
  const double seconds_each = 10e-6 + static_cast<double>(bytes) / 200e9;
  return std::clamp(static_cast<int>(0.02 / seconds_each), 5, 2000);
}

void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw std::runtime_error(fmt::format("{}: {}", call, cudaGetErrorString(status)));
}
void check_nccl(ncclResult_t result, const char* call) {
  if (result != ncclSuccess)
    throw std::runtime_error(fmt::format("{}: {}", call, ncclGetErrorString(result)));
}

// ---------------------------------------------------------------- nccl

awaitable<void> measure_nccl(Communicator& bootstrap, const GpuOptions& options) {
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t compute = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "cudaStreamCreate");
  auto braid_nccl = co_await NcclCommunicator::create(bootstrap, 0, {.compute_stream = compute});
  ncclComm_t direct = nullptr;
  const int devices[] = {0};
  check_nccl(ncclCommInitAll(&direct, 1, devices), "ncclCommInitAll");
  cudaStream_t direct_stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&direct_stream, cudaStreamNonBlocking), "cudaStreamCreate");
  void* input = nullptr;
  void* output = nullptr;
  check_cuda(cudaMalloc(&input, options.max_bytes), "cudaMalloc");
  check_cuda(cudaMalloc(&output, options.max_bytes), "cudaMalloc");
  check_cuda(cudaMemset(input, 0, options.max_bytes), "cudaMemset");

  const Report report(options.json,
                      {"bytes", "iters", "direct (us)", "braid (us)", "overhead", "added (us)"},
                      {12, 7, 14, 14, 10, 11});
  report.say(
      "# braid-bench nccl: all_reduce sum f32, one rank on device 0, each operation completed "
      "before the next\n");
  report.heading();
  for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 4) {
    const std::size_t count = bytes / 4;
    const int iterations = iterations_for(options, bytes);
    std::vector<double> direct_us, braid_us;
    for (int round = -1; round < options.rounds; ++round) {  // round -1 warms up
      auto start = Clock::now();
      for (int i = 0; i < iterations; ++i) {
        check_nccl(ncclAllReduce(input, output, count, ncclFloat32, ncclSum, direct, direct_stream),
                   "ncclAllReduce");
        check_cuda(cudaStreamSynchronize(direct_stream), "cudaStreamSynchronize");
      }
      const double direct_each =
          std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iterations;
      const Buffer in(input, count, DType::f32, MemoryKind::cuda, 0);
      const Buffer out(output, count, DType::f32, MemoryKind::cuda, 0);
      start = Clock::now();
      for (int i = 0; i < iterations; ++i) co_await braid_nccl->all_reduce(in, out, ReduceOp::sum);
      const double braid_each =
          std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iterations;
      if (round >= 0) {
        direct_us.push_back(direct_each);
        braid_us.push_back(braid_each);
      }
    }
    const double direct_median = median(direct_us);
    const double braid_median = median(braid_us);
    const double overhead = (braid_median / direct_median - 1) * 100;
    report.row(
        fmt::format(R"({{"bench":"nccl","op":"all_reduce","bytes":{},"iters":{},)"
                    R"("direct_us":{:.3f},"braid_us":{:.3f},"overhead_pct":{:.2f},)"
                    R"("added_us":{:.3f}}})",
                    bytes, iterations, direct_median, braid_median, overhead,
                    braid_median - direct_median),
        {std::to_string(bytes), std::to_string(iterations), fixed(direct_median, 2),
         fixed(braid_median, 2), fixed(overhead, 1, "%"), fixed(braid_median - direct_median, 2)});
    if (bytes > options.max_bytes / 4) break;
  }
  (void)cudaFree(input);
  (void)cudaFree(output);
  (void)ncclCommDestroy(direct);
  (void)cudaStreamDestroy(direct_stream);
  braid_nccl.reset();
  (void)cudaStreamDestroy(compute);
}

// ---------------------------------------------------------------- cuda-p2p

constexpr std::string_view kResultMarker = "BRAID_CUDA_P2P";

// Seconds to move `iterations` messages of `data` from rank 0 to rank 1.
awaitable<double> one_way(Communicator& comm, Buffer data, Buffer ack, int iterations) {
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    if (comm.rank() == 0) {
      co_await comm.send(data, 1);
    } else {
      co_await comm.recv(data, 0);
    }
  }
  if (comm.rank() == 0) {
    co_await comm.recv(ack, 1);
  } else {
    co_await comm.send(ack, 0);
  }
  co_return std::chrono::duration<double>(Clock::now() - start).count();
}

awaitable<void> measure_cuda_p2p(Communicator& comm, const GpuOptions& options) {
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  std::uint8_t ack_byte = 0;
  const Buffer ack(&ack_byte, 1, DType::u8);
  void* device = nullptr;
  check_cuda(cudaMalloc(&device, options.max_bytes), "cudaMalloc");
  std::vector<std::uint8_t> host(options.max_bytes);
  for (std::size_t bytes = std::max<std::size_t>(options.min_bytes, 1 << 16);
       bytes <= options.max_bytes; bytes *= 4) {
    const int iterations =
        options.iterations > 0
            ? options.iterations
            : std::clamp(static_cast<int>((std::size_t{512} << 20) / bytes), 4, 200);
    const Buffer on_device(device, bytes, DType::u8, MemoryKind::cuda, 0);
    const Buffer on_host(host.data(), bytes, DType::u8);
    std::vector<double> device_gbps, host_gbps;
    for (int round = -1; round < options.rounds; ++round) {
      const double device_s = co_await one_way(comm, on_device, ack, iterations);
      const double host_s = co_await one_way(comm, on_host, ack, iterations);
      if (round >= 0) {
        device_gbps.push_back(static_cast<double>(bytes) * iterations / device_s / 1e9);
        host_gbps.push_back(static_cast<double>(bytes) * iterations / host_s / 1e9);
      }
    }
    if (comm.rank() == 0) {
      std::cout << fmt::format("{} {} {} {:.4f} {:.4f}\n", kResultMarker, bytes, iterations,
                               median(device_gbps), median(host_gbps))
                << std::flush;
    }
    if (bytes > options.max_bytes / 4) break;
  }
  (void)cudaFree(device);
}

int cuda_p2p_driver(GpuOptions& options) {
  const auto result = run_command(
      bench_worker(2, "cuda-p2p",
                   arguments(table(options), {"--min-bytes", "--max-bytes", "--rounds", "--iters"}),
                   600),
      std::chrono::seconds(620));
  if (result.exit_code != 0) {
    std::cerr << "braid-bench cuda-p2p: the measurement failed (exit " << result.exit_code << "):\n"
              << result.output;
    return 1;
  }
  const Report report(options.json, {"bytes", "iters", "cuda (GB/s)", "host (GB/s)", "cuda/host"},
                      {12, 7, 16, 16, 11});
  report.say(
      "# braid-bench cuda-p2p: 2 processes on device 0, UCX communicator send/recv, one message "
      "at a time\n");
  report.heading();
  const std::regex row(std::string(kResultMarker) + R"( (\d+) (\d+) ([0-9.]+) ([0-9.]+))");
  for (std::sregex_iterator it(result.output.begin(), result.output.end(), row), end; it != end;
       ++it) {
    const auto& m = *it;
    const double cuda = std::stod(m[3]);
    const double host = std::stod(m[4]);
    report.row(
        fmt::format(R"({{"bench":"cuda-p2p","bytes":{},"iters":{},"cuda_gbps":{:.4f},)"
                    R"("host_gbps":{:.4f},"ratio":{:.3f}}})",
                    m[1].str(), m[2].str(), cuda, host, cuda / host),
        {m[1].str(), m[2].str(), fixed(cuda, 3), fixed(host, 3), fixed(cuda / host, 2, "x")});
  }
  return 0;
}

int run_nccl(GpuOptions& options) {
  check(options);
  Runtime runtime;
  transport::LaunchInfo alone{.store_host = "127.0.0.1", .source = "braid-bench"};
  auto world = transport::World::join(runtime, alone, {});
  auto bootstrap = Communicator::world(*world);
  runtime.spawn(measure_nccl(*bootstrap, options)).get();
  return 0;
}

int run_cuda_p2p(GpuOptions& options) {
  check(options);
  if (!options.worker) return cuda_p2p_driver(options);
  Runtime runtime;
  auto world = transport::World::join(runtime);
  auto comm = Communicator::world(*world);
  runtime.spawn(measure_cuda_p2p(*comm, options)).get();
  return 0;
}

}  // namespace

Mode nccl_mode() {
  return describe<GpuOptions>(
      {.name = "nccl",
       .about = "(CUDA builds, a GPU) NCCL all-reduce through braid against ncclAllReduce called "
                "directly, one rank: time per operation, overhead %, added microseconds",
       .options = table,
       .run = run_nccl});
}

Mode cuda_p2p_mode() {
  return describe<GpuOptions>(
      {.name = "cuda-p2p",
       .about = "(CUDA builds, a GPU) CUDA buffers between two processes over UCX (staged through "
                "pinned memory), beside host buffers",
       .options = table,
       .run = run_cuda_p2p});
}

}  // namespace braid::bench
