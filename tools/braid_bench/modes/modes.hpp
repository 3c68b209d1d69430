// braid-bench's modes, in the order --help lists them. Each file in modes/ holds one: its
// settings, its options table, how it runs one configuration and how it prints its table.
#pragma once

#include <braid/build_config.hpp>

#include "../harness/mode.hpp"

namespace braid::bench {

Mode p2p_mode();
Mode collectives_mode();
Mode algorithms_mode();
Mode trace_cost_mode();
Mode ddp_mode();
Mode compute_tax_mode();
Mode tp_mode();
Mode pipeline_mode();
Mode sharded_mode();
Mode torch_backend_mode();
Mode recovery_mode();
#if BRAID_WITH_CUDA
Mode nccl_mode();
Mode cuda_p2p_mode();
#endif

}  // namespace braid::bench
