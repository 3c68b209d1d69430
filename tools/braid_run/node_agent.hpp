// The launch agent of emulated nodes: what ssh is to tools that start processes on other
// nodes through a remote shell (OpenMPI's mpirun with its plm_rsh_agent, pdsh, scripts).
//
// Under `braid-run --emulate-nodes N --on-first-node program...` every node serves the agent
// on its address; `braid-run --on-node HOST command...`, run on any node, asks the agent on
// HOST (node<i> or its address) to run the command line through /bin/sh -c, relays its
// standard output and error, and exits with its status, as `ssh HOST command...` does. The
// command runs in HOST's namespaces, with the agent's environment (braid-run's), in the
// caller's working directory (the nodes share the machine's file system), stdin at
// /dev/null. A caller that goes away takes its command with it: the agent stops the
// command's process group (SIGTERM, then SIGKILL after 5 s).
//
// The agent answers only callers that present the job's BRAID_TOKEN, which braid-run gives
// every node. Protocol, over TCP on kNodeAgentPort: the caller sends a u32 length and then
// token, working directory and command line, each ending in NUL; the agent sends frames of
// a type byte, a u32 length and the bytes: 1 standard output, 2 standard error, 3 the exit
// status (u32; 128 + signal when a signal ended the command). Integers are big-endian.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace braid::launcher {

inline constexpr std::uint16_t kNodeAgentPort = 2222;

// Serves callers on address:kNodeAgentPort until the process is killed, each in a process
// of its own. std::system_error when it cannot listen.
[[noreturn]] void serve_node_agent(const std::string& address, const std::string& token);

// Runs `command` (its words joined by spaces, as ssh joins them) on node `host` and returns
// its exit status, or 255 when the agent cannot be reached or goes away first (ssh's status
// for a failed connection), saying why on stderr. An agent not listening yet (its node still
// starting) is waited for up to 10 s.
int run_on_node(const std::string& host, const std::vector<std::string>& command,
                const std::string& token);

}  // namespace braid::launcher
