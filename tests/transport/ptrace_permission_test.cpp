// Under Yama's ptrace_scope 1 a rank names its launcher as its ptracer, so sibling ranks
// may read its memory (transport/ptrace_permission.hpp); under any other scope, or
// without Yama, it leaves the kernel's rules alone.
#include "transport/ptrace_permission.hpp"

#include <filesystem>

#include <gtest/gtest.h>

namespace braid::transport::detail {
namespace {

TEST(PtracePermission, UnderScopeOneTheLauncherIsNamed) {
  EXPECT_EQ(ptracer_to_declare("1\n", 4242), 4242);
  EXPECT_EQ(ptracer_to_declare("1", 4242), 4242);
}

TEST(PtracePermission, WithoutYamaOrUnderAnotherScopeNothingIsDeclared) {
  EXPECT_EQ(ptracer_to_declare(std::nullopt, 4242), std::nullopt);
  EXPECT_EQ(ptracer_to_declare("0\n", 4242), std::nullopt);  // classic ptrace rules
  EXPECT_EQ(ptracer_to_declare("2\n", 4242), std::nullopt);  // admin only: no exception helps
  EXPECT_EQ(ptracer_to_declare("3\n", 4242), std::nullopt);  // no attach at all
  EXPECT_EQ(ptracer_to_declare("", 4242), std::nullopt);
}

TEST(PtracePermission, AnOrphanedRankNamesNobody) {
  // Its parent is gone and init adopted it: naming init would let every process attach.
  EXPECT_EQ(ptracer_to_declare("1\n", 1), std::nullopt);
  EXPECT_EQ(ptracer_to_declare("1\n", 0), std::nullopt);
}

TEST(PtracePermission, ThisKernelIsHandledAsItsScopeSays) {
  const bool yama = std::filesystem::exists("/proc/sys/kernel/yama/ptrace_scope");
  const std::optional<pid_t> declared = let_siblings_attach();
  if (!yama) {
    EXPECT_EQ(declared, std::nullopt);
  } else if (declared) {
    EXPECT_EQ(*declared, getppid());
  }
}

}  // namespace
}  // namespace braid::transport::detail
