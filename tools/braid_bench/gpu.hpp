// braid-bench's GPU modes (built with CUDA; they need a device to run):
//
//   nccl      NCCL all-reduce through braid's NcclCommunicator against ncclAllReduce called
//             directly, one rank, the same sizes, in interleaved rounds: time per
//             operation (each one completed before the next starts, as a training step
//             waits for its gradients), braid's overhead in percent and in microseconds.
//   cuda-p2p  two processes on this host moving CUDA buffers through the UCX communicator
//             (staged through pinned host memory where UCX has no CUDA support), beside
//             the same transfer of host buffers: the staging's bandwidth cost.
#pragma once

#include <string>
#include <vector>

namespace braid::bench {

int run_nccl(const std::vector<std::string>& args);
int run_cuda_p2p(const std::vector<std::string>& args);

}  // namespace braid::bench
