#include "cross_memory.hpp"

#include <sys/uio.h>

#include <cerrno>

namespace braid::collectives::detail {

int read_process_memory(pid_t pid, std::uint64_t remote, void* local, std::size_t bytes) noexcept {
  auto* into = static_cast<std::byte*>(local);
  while (bytes != 0) {
    iovec mine{into, bytes};
    iovec theirs{reinterpret_cast<void*>(remote), bytes};
    const ssize_t got = process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    // A short read stops at the first page the kernel could not pin; the next call
    // reports why, or carries on if it was transient.
    if (got == 0) return EFAULT;
    into += got;
    remote += static_cast<std::uint64_t>(got);
    bytes -= static_cast<std::size_t>(got);
  }
  return 0;
}

}  // namespace braid::collectives::detail
