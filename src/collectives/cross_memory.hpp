// Cross-memory attach: reading another process's memory in one copy (Linux
// process_vm_readv), the way OpenMPI's vader and UCX's cma transport do between processes
// on one node. A collective that knows a peer's buffer address reads the bytes straight
// into its own buffer, where a shared segment would cost a copy in and a copy out.
//
// Cost: one system call per read; the kernel pins the peer's pages a batch at a time and
// copies, about 2/3 of a memcpy's speed for a cold buffer. Whether it is allowed depends on
// the kernel (Yama ptrace_scope, seccomp), so a communicator probes once before relying on
// it and otherwise keeps copying through the segment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sys/types.h>

namespace braid::collectives::detail {

// Reads `bytes` at `remote` in process `pid` into `local`. Returns 0, or the errno of the
// failed read (ESRCH: the process is gone; EFAULT: the range is not mapped there; EPERM:
// the kernel forbids it).
int read_process_memory(pid_t pid, std::uint64_t remote, void* local, std::size_t bytes) noexcept;
// Writes `bytes` from `local` to `remote` in process `pid`; the same errors.
int write_process_memory(pid_t pid, std::uint64_t remote, const void* local,
                         std::size_t bytes) noexcept;

}  // namespace braid::collectives::detail
