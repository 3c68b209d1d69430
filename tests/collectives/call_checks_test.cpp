// The argument checks both communicators share (collectives/call_checks.hpp), with each
// communicator's memory rule: Communicator's (host, or CUDA it can stage) and
// NcclCommunicator's (CUDA memory of its device). Nothing here touches a buffer, so CUDA
// buffers are host memory labelled as device 0's, and no GPU is needed.
#include "collectives/call_checks.hpp"

#include <cstddef>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <braid/core/error.hpp>

namespace braid::collectives::detail {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();

// One of the two communicators, as the checks see it: rank 1 of 2, world rank 5.
struct Side {
  const char* name;
  CallSite site;
  MemoryRule memory;
  MemoryKind kind;  // where its buffers are
};

Side communicator_side() {
  return {"Communicator",
          {.rank = 1, .size = 2, .world_rank = 5},
          host_or_staged_memory(false),
          MemoryKind::host};
}

Side nccl_side() {
  return {"NcclCommunicator",
          {.rank = 1, .size = 2, .world_rank = 5, .communicator = "nccl"},
          device_memory(0),
          MemoryKind::cuda};
}

// A buffer of `count` floats at `elements` into `memory`, where the side keeps buffers.
Buffer at(const Side& side, std::vector<float>& memory, std::size_t elements, std::size_t count) {
  return Buffer(memory.data() + elements, count, DType::f32, side.kind,
                side.kind == MemoryKind::cuda ? 0 : -1);
}

// The error `call` throws with this side's rule; fails the test where it throws none.
Error refusal(const Side& side, const CollectiveCall& call) {
  try {
    check_call(call, side.site, side.memory);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << side.name << " accepted the call";
  return Error(Errc::invalid_argument, "(accepted)");
}

void expect_accepted(const Side& side, const CollectiveCall& call, const std::string& what) {
  try {
    check_call(call, side.site, side.memory);
  } catch (const Error& e) {
    ADD_FAILURE() << side.name << " refused " << what << ": " << e.what();
  }
}

// The calls both sides must refuse, each with the words that name its fault.
struct BadCall {
  const char* what;
  std::function<CollectiveCall(const Side&, std::vector<float>&)> make;
  const char* message;
};

std::vector<BadCall> bad_calls() {
  static const std::vector<std::size_t> wrapping{kMax, 9};
  static const std::vector<std::size_t> eight{4, 4};
  static const std::vector<std::size_t> five_three{5, 3};  // rank 1's block: [5, 8)
  return {
      {"all_gather_v counts that wrap around",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{.kind = CollectiveKind::all_gather,
                               .input = at(s, m, 0, 9),
                               .output = at(s, m, 16, 8),
                               .counts = wrapping,
                               .variable = true};
       },
       "output has 8 elements; the counts add up to 18446744073709551615"},
      {"all_to_all_v send counts that wrap around",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{.kind = CollectiveKind::all_to_all,
                               .input = at(s, m, 0, 8),
                               .output = at(s, m, 16, 8),
                               .counts = wrapping,
                               .recv_counts = eight,
                               .variable = true};
       },
       "input has 8 elements; the send counts add up to 18446744073709551615"},
      {"all_to_all_v receive counts that wrap around",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{.kind = CollectiveKind::all_to_all,
                               .input = at(s, m, 0, 8),
                               .output = at(s, m, 16, 8),
                               .counts = eight,
                               .recv_counts = wrapping,
                               .variable = true};
       },
       "output has 8 elements; the receive counts add up to 18446744073709551615"},
      // size() blocks of 2^63 elements wrap around to 0, which an empty buffer would match.
      {"a reduce_scatter whose blocks add up past SIZE_MAX",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{.kind = CollectiveKind::reduce_scatter,
                               .input = at(s, m, 0, 0),
                               .output = at(s, m, 16, kMax / 2 + 1)};
       },
       "input has 0 elements; it must hold 2 blocks of the output's 9223372036854775808"},
      {"an all_gather whose blocks add up past SIZE_MAX",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{.kind = CollectiveKind::all_gather,
                               .input = at(s, m, 16, kMax / 2 + 1),
                               .output = at(s, m, 0, 0)};
       },
       "output has 0 elements; it must hold 2 blocks of the input's 9223372036854775808"},
      {"an all_reduce whose buffers partly overlap",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{
             .kind = CollectiveKind::all_reduce, .input = at(s, m, 0, 4), .output = at(s, m, 2, 4)};
       },
       "input and output overlap without being the same memory"},
      {"a reduce_scatter into another rank's block",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{.kind = CollectiveKind::reduce_scatter,
                               .input = at(s, m, 0, 8),
                               .output = at(s, m, 0, 4)};
       },
       "input and output overlap without being the same memory"},
      {"an all_gather from a block that straddles two",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{
             .kind = CollectiveKind::all_gather, .input = at(s, m, 2, 4), .output = at(s, m, 0, 8)};
       },
       "input and output overlap without being the same memory"},
      {"an all_gather_v from another rank's block",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{.kind = CollectiveKind::all_gather,
                               .input = at(s, m, 0, 3),
                               .output = at(s, m, 0, 8),
                               .counts = five_three,
                               .variable = true};
       },
       "input and output overlap without being the same memory"},
      {"an all_to_all whose buffers partly overlap",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{
             .kind = CollectiveKind::all_to_all, .input = at(s, m, 0, 8), .output = at(s, m, 4, 8)};
       },
       "input and output overlap without being the same memory"},
      {"an all_to_all_v in place",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{.kind = CollectiveKind::all_to_all,
                               .input = at(s, m, 0, 8),
                               .output = at(s, m, 0, 8),
                               .counts = eight,
                               .recv_counts = eight,
                               .variable = true};
       },
       "all_to_all_v cannot run in place"},
      {"a gather at the root into a block that straddles two",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{.kind = CollectiveKind::gather,
                               .input = at(s, m, 1, 4),
                               .output = at(s, m, 0, 8),
                               .root = 1};
       },
       "input and output overlap without being the same memory"},
      {"a scatter at the root from a block that straddles two",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{.kind = CollectiveKind::scatter,
                               .input = at(s, m, 0, 8),
                               .output = at(s, m, 3, 4),
                               .root = 1};
       },
       "input and output overlap without being the same memory"},
      {"a reduce with too short an output",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{.kind = CollectiveKind::reduce,
                               .input = at(s, m, 0, 8),
                               .output = at(s, m, 16, 7),
                               .root = 1};
       },
       "input has 8 elements and output 7"},
      {"a broadcast from a root outside the communicator",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{.kind = CollectiveKind::broadcast,
                               .input = at(s, m, 0, 8),
                               .output = at(s, m, 0, 8),
                               .root = 2};
       },
       "root 2 is outside a communicator of 2 ranks"},
      {"an all_to_all that does not split into blocks",
       [](const Side& s, std::vector<float>& m) {
         return CollectiveCall{.kind = CollectiveKind::all_to_all,
                               .input = at(s, m, 0, 7),
                               .output = at(s, m, 16, 7)};
       },
       "the buffers' 7 elements must split into 2 equal blocks"},
  };
}

TEST(CallChecks, BothCommunicatorsRefuseTheSameCallsInTheSameWords) {
  for (const BadCall& bad : bad_calls()) {
    std::vector<float> memory(32);
    const Side communicator = communicator_side();
    const Side nccl = nccl_side();
    const Error ours = refusal(communicator, bad.make(communicator, memory));
    const Error theirs = refusal(nccl, bad.make(nccl, memory));
    EXPECT_EQ(ours.code(), Errc::invalid_argument) << bad.what;
    EXPECT_EQ(theirs.code(), Errc::invalid_argument) << bad.what;
    EXPECT_THAT(ours.detail(), HasSubstr(bad.message)) << bad.what;
    EXPECT_EQ(ours.detail(), theirs.detail()) << bad.what;
    // Each names the rank and the operation, the NCCL one as "nccl <operation>".
    EXPECT_EQ(ours.context().rank, 5) << bad.what;
    EXPECT_EQ(theirs.context().rank, 5) << bad.what;
    EXPECT_EQ("nccl " + ours.context().operation, theirs.context().operation) << bad.what;
    EXPECT_THAT(ours.what(), HasSubstr("rank 5: " + ours.context().operation)) << bad.what;
  }
}

TEST(CallChecks, TheVariableFormsAreNamedAsSuch) {
  const Side side = communicator_side();
  std::vector<float> memory(32);
  EXPECT_EQ(refusal(side, bad_calls()[0].make(side, memory)).context().operation, "all_gather_v");
  EXPECT_EQ(refusal(side, bad_calls()[1].make(side, memory)).context().operation, "all_to_all_v");
}

TEST(CallChecks, InPlaceAsNcclDefinesItPassesOnBothCommunicators) {
  for (const Side& side : {communicator_side(), nccl_side()}) {
    std::vector<float> memory(32);
    const Buffer whole = at(side, memory, 0, 8);
    const Buffer mine = at(side, memory, 4, 4);  // rank 1's block of 2
    const std::vector<std::size_t> five_three{5, 3};
    expect_accepted(side, {.kind = CollectiveKind::all_reduce, .input = whole, .output = whole},
                    "all_reduce in place");
    expect_accepted(side, {.kind = CollectiveKind::reduce_scatter, .input = whole, .output = mine},
                    "reduce_scatter into the rank's block");
    expect_accepted(side, {.kind = CollectiveKind::all_gather, .input = mine, .output = whole},
                    "all_gather from the rank's block");
    expect_accepted(side,
                    {.kind = CollectiveKind::all_gather,
                     .input = at(side, memory, 5, 3),
                     .output = whole,
                     .counts = five_three,
                     .variable = true},
                    "all_gather_v from the rank's block");
    expect_accepted(side,
                    {.kind = CollectiveKind::gather, .input = mine, .output = whole, .root = 1},
                    "gather from the root's block");
    expect_accepted(side, {.kind = CollectiveKind::all_to_all, .input = whole, .output = whole},
                    "all_to_all in place");
    expect_accepted(side,
                    {.kind = CollectiveKind::reduce, .input = whole, .output = whole, .root = 1},
                    "reduce in place");
    expect_accepted(side,
                    {.kind = CollectiveKind::all_reduce,
                     .input = at(side, memory, 0, 8),
                     .output = at(side, memory, 8, 8)},
                    "all_reduce on buffers side by side");
    // Away from the root, the root's buffer is not looked at.
    expect_accepted(side, {.kind = CollectiveKind::reduce, .input = whole, .output = {}, .root = 0},
                    "reduce away from the root");
  }
}

TEST(CallChecks, TheInPlaceBlockIsTheRanksAndTheBufferMustSplitEvenly) {
  std::vector<float> memory(8);
  const Side side = nccl_side();
  const Buffer block =
      rank_block(CollectiveKind::reduce_scatter, at(side, memory, 0, 8), side.site);
  EXPECT_EQ(block.data(), memory.data() + 4);
  EXPECT_EQ(block.count(), 4U);
  try {
    (void)rank_block(CollectiveKind::all_gather, at(side, memory, 0, 7), side.site);
    ADD_FAILURE() << "7 elements split into 2 blocks";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_THAT(e.detail(),
                HasSubstr("in place, the buffer's 7 elements must split into 2 equal blocks"));
    EXPECT_EQ(e.context().operation, "nccl all_gather");
  }
}

TEST(CallChecks, EachCommunicatorsMemoryRuleSaysWhereItsBuffersMayBe) {
  std::vector<float> memory(8);
  const Buffer host(memory);
  const Buffer device0(memory.data(), 8, DType::f32, MemoryKind::cuda, 0);
  const Buffer device1(memory.data(), 8, DType::f32, MemoryKind::cuda, 1);
  const Buffer empty_host(memory.data(), 0, DType::f32);
  EXPECT_EQ(host_or_staged_memory(false)(host, "input"), "");
  EXPECT_EQ(host_or_staged_memory(false)(device0, "input"),
            "the input is cuda memory (device 0), and this build of braid has no CUDA");
  EXPECT_EQ(host_or_staged_memory(true)(device1, "input"), "");
  EXPECT_EQ(device_memory(0)(device0, "output"), "");
  EXPECT_EQ(device_memory(0)(empty_host, "output"), "");
  EXPECT_THAT(device_memory(0)(host, "output"), HasSubstr("the output is host memory"));
  EXPECT_EQ(device_memory(0)(device1, "buffer"),
            "the buffer is cuda memory (device 1); this NCCL communicator moves CUDA memory of "
            "device 0");
}

TEST(CallChecks, PointToPointNamesThePeerAndTheBuffer) {
  std::vector<float> memory(8);
  const Side side = nccl_side();
  try {
    check_point_to_point("send", Buffer(memory), 1, side.site, side.memory);
    ADD_FAILURE() << "a host buffer was sent on NCCL";
  } catch (const Error& e) {
    EXPECT_THAT(e.detail(), HasSubstr("the buffer is host memory"));
    EXPECT_EQ(e.context().operation, "nccl send");
  }
  try {
    check_point_to_point("recv", at(side, memory, 0, 8), 2, side.site, side.memory);
    ADD_FAILURE() << "a peer outside the communicator was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.detail(), HasSubstr("peer 2 is outside a communicator of 2 ranks"));
  }
}

TEST(CallChecks, SumsOfCountsSaturateInsteadOfWrappingAround) {
  EXPECT_EQ(sum_of_counts(std::vector<std::size_t>{}), 0U);
  EXPECT_EQ(sum_of_counts(std::vector<std::size_t>{3, 4, 5}), 12U);
  EXPECT_EQ(sum_of_counts(std::vector<std::size_t>{kMax, 1}), kMax);
  EXPECT_EQ(sum_of_counts(std::vector<std::size_t>{kMax / 2 + 1, kMax / 2 + 1}), kMax);
}

}  // namespace
}  // namespace braid::collectives::detail
