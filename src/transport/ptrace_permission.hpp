// Lets this rank's siblings on the node read its memory where the Yama security module
// restricts ptrace to a process's ancestors.
//
// Why: cross-memory attach (process_vm_readv/writev: braid's single-copy shared-memory
// collectives, UCX's cma transport) and pidfd_getfd (the doorbells) need ptrace access
// to the peer. Ubuntu and Fedora ship Yama with ptrace_scope 1, where only an ancestor
// may attach: two ranks started side by side by one launcher are siblings, so every
// cross-process read would be refused and shared-memory collectives would copy through
// the segment (about 2.5x the memory traffic) and nap instead of sleeping on doorbells.
// Yama's own way out is prctl(PR_SET_PTRACER, pid): the process `pid` and everything
// below it may attach to the caller. Each rank names its parent, the launcher (braid-run,
// mpirun's daemon, slurmstepd), which started its siblings too, so they can attach to it
// and nothing outside the job can. A rank started through a shell that did not exec it
// names the shell, and keeps the fallback.
// Cost: one file read and one prctl at join. Scopes 2 (admin only) and 3 (no attach)
// cannot be relaxed this way; there, and without Yama, nothing is done.
#pragma once

#include <optional>
#include <string_view>
#include <sys/types.h>

namespace braid::transport::detail {

// What to declare with PR_SET_PTRACER, from the text of /proc/sys/kernel/yama/ptrace_scope
// (absent without Yama): `parent` under scope 1, else nothing.
std::optional<pid_t> ptracer_to_declare(std::optional<std::string_view> yama_scope, pid_t parent);

// Reads the scope and declares the parent where ptracer_to_declare says so. Returns the
// pid declared, or nothing (no Yama, another scope, or the kernel refused: logged).
std::optional<pid_t> let_siblings_attach();

}  // namespace braid::transport::detail
