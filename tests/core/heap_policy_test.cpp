// The heap policy's decision (braid/core/heap_policy.hpp): on by default, off by its knob,
// and never over an allocator setting the user made. That the policy keeps a training
// step's temporaries out of the page-fault path is tested on real steps, in their own
// processes (tests/torch/heap_policy_process_test.cpp): the policy is process-wide.
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>
#include <braid/core/heap_policy.hpp>

using ::testing::HasSubstr;

namespace braid {
namespace {

config::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(HeapPolicy, KeepsTemporariesOnTheHeapByDefault) {
  const HeapPolicy policy = heap_policy_for(env_of({}));
  ASSERT_TRUE(policy.applied) << policy.reason;
  EXPECT_EQ(policy.mmap_threshold_bytes, std::size_t{32} << 20);
  EXPECT_EQ(policy.trim_threshold_bytes, std::size_t{1} << 30);
}

TEST(HeapPolicy, KnobZeroLeavesTheAllocatorsDefaults) {
  const HeapPolicy policy = heap_policy_for(env_of({{"BRAID_KEEP_HEAP", "0"}}));
  EXPECT_FALSE(policy.applied);
  EXPECT_THAT(policy.reason, HasSubstr("BRAID_KEEP_HEAP=0"));
}

TEST(HeapPolicy, TheUsersOwnAllocatorSettingsWin) {
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                           "MALLOC_MMAP_MAX_"}) {
    const HeapPolicy policy = heap_policy_for(env_of({{name, "65536"}}));
    EXPECT_FALSE(policy.applied) << name;
    EXPECT_THAT(policy.reason, HasSubstr(name));
  }
  const HeapPolicy tuned =
      heap_policy_for(env_of({{"GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0"}}));
  EXPECT_FALSE(tuned.applied);
  EXPECT_THAT(tuned.reason, HasSubstr("GLIBC_TUNABLES"));
  // Tunables of other parts of glibc are not an allocator policy.
  EXPECT_TRUE(heap_policy_for(env_of({{"GLIBC_TUNABLES", "glibc.pthread.rseq=0"}})).applied);
}

TEST(HeapPolicy, AMalformedKnobIsAnErrorNamingIt) {
  try {
    heap_policy_for(env_of({{"BRAID_KEEP_HEAP", "sometimes"}}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), make_error_code(Errc::invalid_environment));
    EXPECT_THAT(e.what(), HasSubstr("BRAID_KEEP_HEAP"));
  }
}

TEST(HeapPolicy, AppliesOncePerProcessAndSaysWhat) {
  const HeapPolicy& first = apply_heap_policy();
  const HeapPolicy& again = apply_heap_policy();
  EXPECT_EQ(&first, &again);
  EXPECT_EQ(first.applied, heap_policy_for().applied);
}

}  // namespace
}  // namespace braid
