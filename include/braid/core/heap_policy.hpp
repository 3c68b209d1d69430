// How the process's heap treats a training step's recurring temporaries.
//
// A training step allocates the same temporaries every step: Adam's per-parameter
// intermediates, backward's weight-gradient products, activations. With glibc's defaults
// each of them is paid in page faults every step, because glibc hands freed memory back
// to the kernel: blocks of 128 KiB and more are mapped and unmapped one by one, and its
// "dynamic threshold" (which raises the mapping threshold to the largest mapped block
// freed so far, and the heap-trim threshold to twice that) only moves when a program
// frees a large mapped block. A C++ training loop whose big buffers live for the whole
// run (parameters, optimizer state, DDP's buckets in shared memory) settles at a trim
// threshold of about twice its largest temporary, so the heap's top is given back and
// faulted in again several times a step, and the faults can cost more than the step's
// arithmetic (figures: docs/layers/core.md and docs/benchmarks.md, "The heap policy").
// Python PyTorch escapes it by accident (the interpreter frees large mapped blocks
// while it imports, which raises both thresholds).
//
// braid is the runtime of the training loop, so the Runtime applies a policy once per
// process (apply_heap_policy, called by Runtime's constructor): blocks under 32 MiB come
// from the heap (M_MMAP_THRESHOLD, glibc's largest dynamic value) and the heap keeps up
// to 1 GiB of free memory at its top (M_TRIM_THRESHOLD) instead of returning it.
//
// Cost: memory a step freed stays in the process for the next step, so the resident size
// stays at the step's peak instead of falling between steps (by at most 1 GiB more than
// glibc would keep; most programs keep far less, since the kept memory is only what the
// program used at its peak). Blocks of 32 MiB and more are still mapped and faulted in
// each time. BRAID_KEEP_HEAP=0 leaves glibc's defaults; a MALLOC_MMAP_THRESHOLD_,
// MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_ or glibc.malloc tunable in
// the environment also does (the user's own policy wins). Elsewhere than glibc it does
// nothing.
#pragma once

#include <cstddef>
#include <string>

#include <braid/core/config.hpp>

namespace braid {

struct HeapPolicy {
  bool applied = false;
  std::string reason;  // why not, when not applied
  std::size_t mmap_threshold_bytes = 0;
  std::size_t trim_threshold_bytes = 0;
};

inline constexpr std::size_t kHeapMmapThresholdBytes = std::size_t{32} << 20;
inline constexpr std::size_t kHeapTrimThresholdBytes = std::size_t{1} << 30;

// What the policy would do with this environment (BRAID_KEEP_HEAP and the allocator's
// own variables), without doing it. An invalid BRAID_KEEP_HEAP is an
// Error(invalid_environment) naming it.
HeapPolicy heap_policy_for(const config::EnvLookup& env = config::process_env());

// Applies heap_policy_for(process environment) the first time it is called in the process
// and returns what it did; later calls return the same. Thread-safe. The Runtime calls it;
// programs that allocate their training state before making a Runtime may call it first.
const HeapPolicy& apply_heap_policy();

}  // namespace braid
