// Places where a test can make this process die on purpose, to prove that the job recovers
// from a failure at exactly that point: BRAID_FAULT=<point>:<n>:<rank> has rank <rank>
// SIGKILL itself the n-th time it passes <point>, in the job's first start only (a
// restarted job, BRAID_RESTART_COUNT > 0, runs clean). A kill from outside lands wherever
// the process happens to be; these land in the middle of what recovery must survive.
//
// What it costs when BRAID_FAULT is unset (always, outside tests): one relaxed load of a
// flag per pass.
#pragma once

#include <string_view>

namespace braid {

enum class FaultPoint {
  forward,           // DDP's forward begins (dp, torch)
  bucket_reduction,  // a gradient bucket's reduction is in flight (dp)
  pipeline_send,     // a pipeline stage's send is in flight (torch)
  memory_copy,       // halfway through an in-memory checkpoint's copy (torch)
  disk_write,        // halfway through a checkpoint file's write (torch)
};

// The name BRAID_FAULT uses for `point`: forward, bucket-reduction, pipeline-send,
// memory-copy, disk-write.
std::string_view fault_point_name(FaultPoint point);

// Counts a pass of `point`; SIGKILLs this process when BRAID_FAULT names it, this pass and
// this rank. A malformed BRAID_FAULT is an Error(invalid_environment) at the first pass.
void fault_point(FaultPoint point);

}  // namespace braid
