// Which buffers collectives move onto transparent huge pages (huge_page_advice.hpp): a
// buffer of 4 MiB or more seen a second time, only its whole 2 MiB pages, contents kept.
#include "collectives/huge_page_advice.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/mman.h>

#include <gtest/gtest.h>

#include "../support/anon_huge_pages.hpp"

namespace braid::collectives::detail {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// 16 MiB of anonymous memory, filled with a pattern; `aligned` is its first 2 MiB boundary.
struct Mapping {
  Mapping() {
    base = static_cast<std::byte*>(
        ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base == MAP_FAILED) base = nullptr;
    if (base == nullptr) return;
    const auto address = reinterpret_cast<std::uintptr_t>(base);
    aligned = base + (((address + 2 * kMiB - 1) & ~(2 * kMiB - 1)) - address);
    for (std::size_t i = 0; i < kBytes; ++i) base[i] = static_cast<std::byte>(i * 31 + 7);
  }
  ~Mapping() {
    if (base != nullptr) ::munmap(base, kBytes);
  }
  bool pattern_intact() const {
    for (std::size_t i = 0; i < kBytes; ++i) {
      if (base[i] != static_cast<std::byte>(i * 31 + 7)) return false;
    }
    return true;
  }
  // AnonHugePages of the mapping that holds `base`, in KiB.
  long huge_kib() const { return braid::testing::anon_huge_kib_at(base); }
  static constexpr std::size_t kBytes = 16 * kMiB;
  std::byte* base = nullptr;
  std::byte* aligned = nullptr;
};

// MADV_COLLAPSE came with Linux 6.1; earlier kernels answer EINVAL. Tried on a mapping
// of its own, gone before the test maps the one it measures (the kernel may merge
// neighbouring mappings, and smaps counts per mapping).
bool kernel_collapses() {
  Mapping scratch;
  return scratch.base != nullptr &&
         (::madvise(scratch.aligned, 2 * kMiB, 25 /* MADV_COLLAPSE */) == 0 || errno != EINVAL);
}

// The buffer's later uses collapse it: the first of them unless the kernel has no huge
// page free at that moment (EAGAIN, ENOMEM), as under a parallel build; then one of the
// next HugePageAdvice::kCollapseTries - 1.
bool collapses(HugePageAdvice& advice, const void* buffer, std::size_t bytes) {
  for (int use = 0; use < HugePageAdvice::kCollapseTries; ++use) {
    if (advice.note(buffer, bytes)) return true;
  }
  return false;
}

TEST(HugePageAdvice, ABufferSeenASecondTimeMovesItsWholeHugePagesOntoThemWithContentsKept) {
  if (!kernel_collapses()) GTEST_SKIP() << "this kernel has no MADV_COLLAPSE (Linux 6.1)";
  Mapping memory;
  ASSERT_NE(memory.base, nullptr);
  // 1 MiB past a boundary, 8 MiB long: the whole huge pages inside are the three after it.
  std::byte* const buffer = memory.aligned + kMiB;
  HugePageAdvice advice(true);
  EXPECT_FALSE(advice.note(buffer, 8 * kMiB)) << "a buffer seen once may be used once";
  EXPECT_EQ(memory.huge_kib(), 0);
  EXPECT_TRUE(collapses(advice, buffer, 8 * kMiB));
  EXPECT_EQ(memory.huge_kib(), 3 * 2048) << "only huge pages wholly inside the buffer";
  EXPECT_TRUE(memory.pattern_intact());
  EXPECT_FALSE(advice.note(buffer, 8 * kMiB)) << "advised once, never again";
}

// A buffer on 2 MiB boundaries moves whole; sizes identify buffers.
TEST(HugePageAdvice, ABufferOnHugePageBoundariesMovesWholeAndAnotherSizeIsAnotherBuffer) {
  if (!kernel_collapses()) GTEST_SKIP() << "this kernel has no MADV_COLLAPSE (Linux 6.1)";
  Mapping memory;
  ASSERT_NE(memory.base, nullptr);
  HugePageAdvice advice(true);
  std::byte* const whole = memory.aligned + 8 * kMiB;  // 4 MiB on a boundary: 2 huge pages
  EXPECT_FALSE(advice.note(whole, 4 * kMiB)) << "seen once: not moved yet";
  EXPECT_EQ(memory.huge_kib(), 0);
  EXPECT_TRUE(collapses(advice, whole, 4 * kMiB));
  EXPECT_EQ(memory.huge_kib(), 2 * 2048);
  EXPECT_FALSE(advice.note(whole, 6 * kMiB)) << "another size: another buffer, seen once";
  EXPECT_TRUE(memory.pattern_intact());
}

TEST(HugePageAdvice, SmallBuffersOnesSeenOnceAndEverythingWithTheKnobOffStayAsTheyAre) {
  Mapping memory;
  ASSERT_NE(memory.base, nullptr);
  HugePageAdvice advice(true);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(advice.note(memory.aligned, 4 * kMiB - 1));
  EXPECT_FALSE(advice.note(memory.aligned, 6 * kMiB));
  EXPECT_FALSE(advice.note(memory.aligned, 8 * kMiB)) << "another size is another buffer";
  HugePageAdvice off(false);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(off.note(memory.aligned, 8 * kMiB));
  EXPECT_EQ(memory.huge_kib(), 0);
  EXPECT_TRUE(memory.pattern_intact());
}

}  // namespace
}  // namespace braid::collectives::detail
