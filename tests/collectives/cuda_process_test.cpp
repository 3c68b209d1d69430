// Two processes on one GPU moving CUDA buffers over UCX (cuda_transfer_probe.cpp, under
// braid-run). GPU-labelled: skipped without a CUDA device.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../support/child_process.hpp"
#include "../support/cuda_device.hpp"

namespace {

using braid::testing::ChildProcess;
using braid::testing::program_from_env;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(CudaProcesses, TwoRanksOnOneGpuMoveCudaBuffersOverUcx) {
  if (!braid::testing::has_cuda_device()) GTEST_SKIP() << "no CUDA device";
  auto result = ChildProcess({program_from_env("BRAID_RUN"), "-n", "2", "--timeout", "120",
                              program_from_env("CUDA_TRANSFER_PROBE")},
                             {}, 150s)
                    .wait();
  ASSERT_EQ(result.status, 0) << result.out << result.err;
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(result.out, HasSubstr(fmt::format("[{}] rank {} ok", r, r))) << result.err;
  }
}

}  // namespace
