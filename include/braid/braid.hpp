// The one header users include. The libtorch adapter (braid/torch/, libbraid_torch,
// dependency('braid-torch')) has its own headers, included where a program uses tensors.
#pragma once

#include <braid/build_config.hpp>
#include <braid/collectives/agreement.hpp>
#include <braid/collectives/algorithm.hpp>
#include <braid/collectives/communicator.hpp>
#include <braid/collectives/gather_timeline.hpp>
#include <braid/collectives/reduce_kernels.hpp>
#include <braid/collectives/selection.hpp>
#include <braid/core/buffer.hpp>
#include <braid/core/config.hpp>
#include <braid/core/deadline.hpp>
#include <braid/core/dtype.hpp>
#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>
#include <braid/core/excerpt.hpp>
#include <braid/core/foreign_completion.hpp>
#include <braid/core/future.hpp>
#include <braid/core/heap_policy.hpp>
#include <braid/core/host_stream.hpp>
#include <braid/core/log.hpp>
#include <braid/core/reduce_op.hpp>
#include <braid/core/runtime.hpp>
#include <braid/core/stream.hpp>
#include <braid/dp/bucket_plan.hpp>
#include <braid/dp/model_state_memory.hpp>
#include <braid/dp/reducer.hpp>
#include <braid/parallel/grid_layout.hpp>
#include <braid/parallel/grid_spec.hpp>
#include <braid/parallel/rank_grid.hpp>
#include <braid/trace/chrome_trace.hpp>
#include <braid/trace/output.hpp>
#include <braid/trace/recorder.hpp>
#include <braid/trace/region.hpp>
#include <braid/trace/sampling.hpp>
#include <braid/trace/span.hpp>
#include <braid/trace/summary.hpp>
#include <braid/trace/timeline.hpp>
#include <braid/trace/timeline_bytes.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/hostlist.hpp>
#include <braid/transport/store/store.hpp>
#include <braid/transport/ucx/tag.hpp>
#include <braid/transport/ucx/ucx_error.hpp>
#include <braid/transport/ucx/ucx_worker.hpp>
#include <braid/transport/world.hpp>

#if BRAID_WITH_CUDA
#include <braid/collectives/nccl_communicator.hpp>
#include <braid/core/cuda_error.hpp>
#include <braid/core/cuda_stream.hpp>
#include <braid/core/nccl_error.hpp>
#include <braid/trace/cuda_timeline.hpp>
#endif
