// braid-bench: braid's benchmarks, each printed beside the peers it competes with,
// measured in the same run.
//
//   braid-bench p2p [--json] [--no-peers] [--latency-iters N] [--bandwidth-iters N]
#include <algorithm>
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <braid/build_config.hpp>
#include <braid/collectives/selection.hpp>
#include <braid/core/excerpt.hpp>

#include "collectives.hpp"
#include "compute_tax.hpp"
#include "ddp.hpp"
#include "p2p.hpp"
#include "pipeline.hpp"
#include "sharded.hpp"
#include "torch_backend.hpp"
#include "tp.hpp"
#include "trace_cost.hpp"
#if BRAID_WITH_CUDA
#include "gpu.hpp"
#endif

namespace {

constexpr const char* kUsage =
    "usage: braid-bench MODE [options]\n"
    "modes:\n"
    "  p2p   8-byte latency and 4 MiB bandwidth between two processes, beside ucx_perftest\n"
    "        options: --json --no-peers --latency-iters N --bandwidth-iters N --window N\n"
    "  collectives  every collective from --min-bytes to --max-bytes on --ranks, beside OpenMPI\n"
    "        and torch.distributed Gloo; every size checked for correctness\n"
    "        options: --ranks 2,4 --ops all_reduce,... --min-bytes 8 --max-bytes 64M --iters N\n"
    "                 --rounds N (braid and peers take turns N times; rows report medians)\n"
    "                 --json --no-peers\n"
    "                 --shared-buffers (braid's buffers from Communicator::allocate_shared)\n"
    "  algorithms   the collective algorithm selection table in force (BRAID_ALGO applied)\n"
    "  trace-cost   ns per trace span off and on, the small-call sampling decision, and an\n"
    "               all-reduce loop's time with tracing off and on in ~2 ms batches, with the\n"
    "               default sampling and with every call recorded\n"
    "        options: --ranks 2 --sizes 8,65536,1048576 --rounds 101 (groups of four batches)\n"
    "                 --iters N (per batch)\n"
    "  ddp          one model trained with braid DDP, PyTorch DDP (Gloo) and no sync, in one run:\n"
    "               step time, exposed communication, bare all-reduce, ratios\n"
    "        options: --ranks 2 --hidden 1024 --layers 8 --batch 32 --steps 30 --rounds 3 "
    "--optimizers sgd,adam --straggle-ms 0 (the last rank computes that much more a step)\n"
    "                 --balance: equal batch shares, the batch balancer and the cadence mode\n"
    "                 with a slower last rank (needs --straggle-ms; --batch 128 by default)\n"
    "                 beside the ideal step\n"
    "  compute-tax  one training step with no communication (the main job's MLP and transformer,\n"
    "               SGD and Adam) in a plain libtorch program, a braid process and Python\n"
    "               PyTorch, taking turns: step time, page faults, braid's ratios\n"
    "        options: --models mlp,transformer --optimizers sgd,adam --rounds 3 --steps 40 "
    "--json\n"
    "  tp           tensor-parallel transformer blocks at TP 1 and TP 2, TP 2 without the\n"
    "               backward overlap, beside PyTorch (Megatron-style, Gloo): step time, exposed\n"
    "               TP communication, speed-up against TP 1 beside the ideal\n"
    "        options: --ranks 2 --hidden 256 --heads 8 --layers 2 --seq 64 --batch 4 --steps 20\n"
    "                 --rounds 3 --sequence-parallel (adds a row) --json\n"
    "  pipeline     the 3D job's model on 4 ranks (pp 4, pp 2 x dp 2) under each schedule: step\n"
    "               time and bubble beside the simulator's (with the measured costs) and the\n"
    "               formula, the data-parallel reduction's exposed time with and without overlap\n"
    "        options: --rounds 3 --steps 12 --microbatches 8 --layers 8 --hidden 128 --heads 4\n"
    "                 --seq 32 --global-batch 32 --schedules gpipe,1f1b,interleaved,zb\n"
    "                 --layouts pp4,pp2xdp2 --json\n"
    "  sharded      the main job's model under DDP, ZeRO-1 (ZeroRedundancyOptimizer) and FSDP's\n"
    "               SHARD_GRAD_OP, FULL_SHARD and NO_SHARD on 2 and 4 ranks: step time, exposed\n"
    "               and traced communication, model state per rank by the ZeRO formulas beside\n"
    "               what the ranks held, peak resident size\n"
    "        options: --ranks 2,4 --strategies none,optimizer,grad,full,no_shard --model mlp\n"
    "                 --hidden 512 --layers 5 --batch 32 --steps 20 --rounds 3 --optimizer adam\n"
    "                 --json\n"
    "  nccl         (CUDA builds, a GPU) NCCL all-reduce through braid against ncclAllReduce "
    "called\n"
    "               directly, one rank: time per operation, overhead %, added microseconds\n"
    "        options: --min-bytes 8 --max-bytes 256M --rounds 7 --iters N --json\n"
    "  torch-backend  one PyTorch DDP program on torch.distributed's \"gloo\" and \"braid\"\n"
    "               backends in turn: step time and exposed communication, then all_reduce's\n"
    "               time from Python, 1 KiB to 16 MiB, gloo's over braid's\n"
    "        options: --ranks 2 --steps 20 --width 1024 --batch 64\n"
    "  cuda-p2p     (CUDA builds, a GPU) CUDA buffers between two processes over UCX (staged\n"
    "               through pinned memory), beside host buffers\n"
    "        options: --min-bytes 64K --max-bytes 256M --rounds 7 --iters N --json\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cerr << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string mode = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  // "braid-bench MODE --help": every mode's options are in the one usage text.
  if (std::find(args.begin(), args.end(), "--help") != args.end() ||
      std::find(args.begin(), args.end(), "-h") != args.end()) {
    std::cout << kUsage;
    return 0;
  }
  try {
    if (mode == "p2p") return braid::bench::run_p2p(args);
    if (mode == "collectives") return braid::bench::run_collectives(args);
    if (mode == "trace-cost") return braid::bench::run_trace_cost(args);
    if (mode == "ddp") return braid::bench::run_ddp(args);
    if (mode == "compute-tax") return braid::bench::run_compute_tax(args);
    if (mode == "tp") return braid::bench::run_tp(args);
    if (mode == "pipeline") return braid::bench::run_pipeline(args);
    if (mode == "sharded") return braid::bench::run_sharded(args);
    if (mode == "torch-backend") return braid::bench::run_torch_backend(args);
#if BRAID_WITH_CUDA
    if (mode == "nccl") return braid::bench::run_nccl(args);
    if (mode == "cuda-p2p") return braid::bench::run_cuda_p2p(args);
#endif
    if (mode == "algorithms") {
      std::cout << braid::collectives::SelectionTable::from_environment().describe();
      return 0;
    }
    std::cerr << "braid-bench: unknown mode '" << braid::excerpt(mode)
              << "' (braid-bench --help lists them)\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "braid-bench " << mode << ": " << e.what() << " (braid-bench --help for usage)\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr
        << "braid-bench " << mode
        << ": out of memory for the buffers asked for (a smaller --max-bytes, fewer --ranks)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "braid-bench " << mode << ": " << e.what() << "\n";
    return 1;
  }
}
