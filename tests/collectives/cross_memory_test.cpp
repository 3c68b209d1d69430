// Cross-memory attach, the single-copy path of shared-memory collectives: what a read
// returns, and the errors a collective turns into messages naming a rank.
#include "collectives/cross_memory.hpp"

#include <array>
#include <cerrno>
#include <cstdint>
#include <numeric>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

namespace braid::collectives::detail {
namespace {

std::uint64_t address_of(const void* p) {
  return reinterpret_cast<std::uint64_t>(p);
}

TEST(CrossMemory, ReadsAnotherProcesssBufferExactly) {
  // A child holds the data (forked, so at the same address) until we have read it.
  std::vector<std::uint32_t> data(300001);
  std::iota(data.begin(), data.end(), 7U);
  std::array<int, 2> hold{};
  ASSERT_EQ(pipe(hold.data()), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(hold[1]);
    char byte = 0;
    (void)!read(hold[0], &byte, 1);
    _exit(0);
  }
  close(hold[0]);
  std::vector<std::uint32_t> copy(data.size());
  // Change ours after the fork: the read must return the child's bytes, not ours.
  std::fill(data.begin(), data.end(), 0U);
  const int error =
      read_process_memory(child, address_of(data.data()), copy.data(), copy.size() * 4);
  close(hold[1]);
  int status = 0;
  waitpid(child, &status, 0);
  if (error == EPERM) GTEST_SKIP() << "this kernel forbids cross-memory attach";
  ASSERT_EQ(error, 0);
  for (std::size_t i = 0; i < copy.size(); ++i) {
    ASSERT_EQ(copy[i], 7U + i) << "element " << i;
  }
}

TEST(CrossMemory, AProcessThatIsGoneIsEsrch) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  std::uint64_t word = 0;
  EXPECT_EQ(read_process_memory(child, address_of(&word), &word, sizeof word), ESRCH);
}

TEST(CrossMemory, AnAddressNotMappedThereIsEfault) {
  std::uint64_t word = 0;
  EXPECT_EQ(read_process_memory(getpid(), 8, &word, sizeof word), EFAULT);
}

}  // namespace
}  // namespace braid::collectives::detail
