// A braid process's training steps take their temporaries from the heap, not from fresh
// mappings the kernel faults in every step (braid/core/heap_policy.hpp). Each case runs
// braid-bench's compute worker (tools/braid_bench/workers/compute_step.cpp, a one-rank braid
// process training the main job's models under no_sync()) in a process of its own, since the policy
// is process-wide, and reads the minor page faults per step it reports.
#include <string>

#include <gtest/gtest.h>

#include "../support/child_process.hpp"

namespace braid::testing {
namespace {

// The worker's faults_per_step over `steps` steps after a warm-up.
double faults_per_step(const std::string& model, const Env& env, int steps = 8) {
  Env with_world = env;
  with_world["BRAID_WORLD_SIZE"] = "1";  // a single process needs no launcher
  const Outcome outcome =
      run_child({program_from_env("COMPUTE_BRAID"), "--model", model, "--optimizer", "adam",
                 "--steps", std::to_string(steps), "--warmup", "3"},
                with_world);
  EXPECT_EQ(outcome.status, 0) << outcome.err;
  const auto at = outcome.out.find("\"faults_per_step\":");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no faults_per_step in: " << outcome.out << outcome.err;
    return -1;
  }
  return std::stod(outcome.out.substr(at + 18));
}

// A page is 4 KiB: with glibc's defaults an Adam step of the MLP (1.4M parameters) faults
// in 400-1,400 pages a step on PyTorch 2.11 (fewer while other processes load the machine),
// the transformer's ~1,400; with the policy none, or a few dozen in steps where the heap
// still grows. A trim threshold of 0 faults in ~4,000.
constexpr double kFewFaults = 200;
constexpr double kFaultedEveryStep = 1000;

TEST(HeapPolicy, AdamStepsOfTheMlpAreNotFaultedInAgain) {
  EXPECT_LT(faults_per_step("mlp", {}), kFewFaults);
}

// Over 8 steps, as the MLP's: the transformer's heap may still grow once after the warm-up
// (where depends on the process's earlier allocations), and 4 MiB of growth averaged over
// 4 steps alone read as 256 faults a step.
TEST(HeapPolicy, AdamStepsOfTheTransformerAreNotFaultedInAgain) {
  EXPECT_LT(faults_per_step("transformer", {}, 8), kFewFaults);
}

TEST(HeapPolicy, KnobZeroGivesBackGlibcsPerStepFaults) {
  // What the policy is for: without it this glibc faults the step's temporaries in again,
  // more than the policy ever lets through.
  EXPECT_GT(faults_per_step("mlp", {{"BRAID_KEEP_HEAP", "0"}}), 2 * kFewFaults);
}

TEST(HeapPolicy, AUsersOwnAllocatorSettingIsLeftAlone) {
  // A trim threshold of 0 (give every free byte back) is the user's choice, kept as made.
  EXPECT_GT(faults_per_step("mlp", {{"MALLOC_TRIM_THRESHOLD_", "0"}}), kFaultedEveryStep);
}

}  // namespace
}  // namespace braid::testing
