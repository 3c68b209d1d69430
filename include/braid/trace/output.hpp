// Where and when a process writes its trace. `World::join` calls set_output() when
// BRAID_TRACE names a directory, after measuring the clock offset; programs without a
// World (or tests) may call it themselves.
//
//   trace::set_output("traces", {.rank = 0, .world_size = 1});  // tracing on
//   ...
//   trace::write();  // on demand; also when the World leaves and at exit
//
// Every write is the whole snapshot so far, replacing the rank's file, so a job killed
// later still leaves the trace of its last write.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>

#include <braid/trace/chrome_trace.hpp>

namespace braid::trace {

// Turns tracing on and makes `directory` (created if missing) this process's trace
// output, replacing an earlier one; the first call also registers a write at exit.
// Throws braid::Error(Errc::invalid_argument) when the directory cannot be created.
void set_output(const std::filesystem::path& directory, TraceIdentity identity);

// Writes the snapshot to <directory>/rank-<r>.trace.json and returns that path; nullopt
// when no output is set. Safe from any thread, while others record.
std::optional<std::filesystem::path> write();

// Forgets the output: later write()s, and the one at exit, write nothing. Tracing stays on.
void clear_output();

// The output set, if any.
std::optional<std::filesystem::path> output_file();

// Functions write() runs before it takes its snapshot, so that recorders holding records
// back (GPU spans waiting for their events) hand them in first. A hook must not call
// write(). Returns an id for remove_write_hook().
std::uint64_t add_write_hook(std::function<void()> hook);
void remove_write_hook(std::uint64_t id);

}  // namespace braid::trace
