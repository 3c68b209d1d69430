#include <array>
#include <mutex>
#include <string_view>

#include <fmt/format.h>

#include <braid/core/heap_policy.hpp>
#include <braid/core/log.hpp>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace braid {

HeapPolicy heap_policy_for(const config::EnvLookup& env) {
  HeapPolicy policy;
  if (!config::bool_value("BRAID_KEEP_HEAP", env)) {
    policy.reason = "BRAID_KEEP_HEAP=0";
    return policy;
  }
#if defined(__GLIBC__)
  // The user's own allocator settings win: any of them means someone chose.
  static constexpr std::array kAllocatorVariables{
      std::string_view("MALLOC_MMAP_THRESHOLD_"), std::string_view("MALLOC_TRIM_THRESHOLD_"),
      std::string_view("MALLOC_TOP_PAD_"), std::string_view("MALLOC_MMAP_MAX_")};
  for (const std::string_view name : kAllocatorVariables) {
    if (env(name)) {
      policy.reason = fmt::format("{} is set", name);
      return policy;
    }
  }
  if (const auto tunables = env("GLIBC_TUNABLES");
      tunables && tunables->find("glibc.malloc.") != std::string::npos) {
    policy.reason = "GLIBC_TUNABLES sets glibc.malloc tunables";
    return policy;
  }
  policy.applied = true;
  policy.mmap_threshold_bytes = kHeapMmapThresholdBytes;
  policy.trim_threshold_bytes = kHeapTrimThresholdBytes;
#else
  policy.reason = "not glibc";
#endif
  return policy;
}

const HeapPolicy& apply_heap_policy() {
  static HeapPolicy policy;
  static std::once_flag once;
  std::call_once(once, [] {
    policy = heap_policy_for();
#if defined(__GLIBC__)
    if (policy.applied) {
      // Setting either turns glibc's dynamic thresholds off, so both are set together.
      const bool mmap_set =
          mallopt(M_MMAP_THRESHOLD, static_cast<int>(policy.mmap_threshold_bytes)) == 1;
      const bool trim_set =
          mallopt(M_TRIM_THRESHOLD, static_cast<int>(policy.trim_threshold_bytes)) == 1;
      if (!mmap_set || !trim_set) {
        policy.applied = false;
        policy.reason = "glibc refused mallopt";
      }
    }
#endif
    if (policy.applied) {
      log::debug(
          "heap: blocks under {} MiB from the heap, up to {} MiB kept free at its top "
          "(BRAID_KEEP_HEAP=0: glibc's defaults)",
          policy.mmap_threshold_bytes >> 20, policy.trim_threshold_bytes >> 20);
    } else {
      log::debug("heap: glibc's defaults ({})", policy.reason);
    }
  });
  return policy;
}

}  // namespace braid
