#include "collectives/cross_memory.hpp"

#include <cerrno>
#include <cstddef>
#include <sys/uio.h>

namespace braid::collectives::detail {

namespace {

// One direction of process_vm_readv / process_vm_writev, repeated past short transfers.
template <class Transfer>
int move_all(pid_t pid, std::uint64_t remote, std::byte* local, std::size_t bytes,
             Transfer transfer) noexcept {
  while (bytes != 0) {
    iovec mine{local, bytes};
    iovec theirs{reinterpret_cast<void*>(remote), bytes};
    const ssize_t moved = transfer(pid, &mine, 1, &theirs, 1, 0);
    if (moved < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    // A short transfer stops at the first page the kernel could not pin; the next call
    // reports why, or carries on if it was transient.
    if (moved == 0) return EFAULT;
    local += moved;
    remote += static_cast<std::uint64_t>(moved);
    bytes -= static_cast<std::size_t>(moved);
  }
  return 0;
}

}  // namespace

int read_process_memory(pid_t pid, std::uint64_t remote, void* local, std::size_t bytes) noexcept {
  return move_all(pid, remote, static_cast<std::byte*>(local), bytes, process_vm_readv);
}

int write_process_memory(pid_t pid, std::uint64_t remote, const void* local,
                         std::size_t bytes) noexcept {
  return move_all(pid, remote, static_cast<std::byte*>(const_cast<void*>(local)), bytes,
                  process_vm_writev);
}

}  // namespace braid::collectives::detail
