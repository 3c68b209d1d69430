#include <cstdlib>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/trace/output.hpp>

namespace braid::trace {
namespace {

struct Output {
  std::mutex mutex;
  std::optional<std::filesystem::path> file;
  TraceIdentity identity;
  bool exit_hook = false;
  std::mutex hooks_mutex;  // apart from `mutex`, so a hook may record while write() waits
  std::map<std::uint64_t, std::function<void()>> hooks;
  std::uint64_t next_hook = 1;
};

// Never destroyed: the exit hook runs while static destructors may already have run.
Output& output() {
  static Output* instance = new Output;
  return *instance;
}

void write_at_exit() {
  try {
    write();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid: writing the trace at exit: %s\n", e.what());
  }
}

}  // namespace

void set_output(const std::filesystem::path& directory, TraceIdentity identity) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error || !std::filesystem::is_directory(directory)) {
    throw Error(Errc::invalid_argument,
                fmt::format("cannot use '{}' as the trace directory: {}", directory.string(),
                            error ? error.message() : "not a directory"),
                {.rank = identity.rank, .operation = "trace::set_output"});
  }
  Output& state = output();
  {
    std::lock_guard lock(state.mutex);
    state.file = directory / trace_file_name(identity.rank);
    state.identity = std::move(identity);
    if (!state.exit_hook) {
      state.exit_hook = true;
      std::atexit(write_at_exit);
    }
  }
  set_enabled(true);
}

std::optional<std::filesystem::path> write() {
  Output& state = output();
  {
    std::lock_guard hooks_lock(state.hooks_mutex);
    for (auto& [id, hook] : state.hooks) hook();
  }
  // Held while writing, so two writers never race on the temporary file.
  std::lock_guard lock(state.mutex);
  if (!state.file) return std::nullopt;
  write_chrome_trace(*state.file, snapshot(), state.identity);
  return state.file;
}

void clear_output() {
  Output& state = output();
  std::lock_guard lock(state.mutex);
  state.file.reset();
}

std::uint64_t add_write_hook(std::function<void()> hook) {
  Output& state = output();
  std::lock_guard lock(state.hooks_mutex);
  const std::uint64_t id = state.next_hook++;
  state.hooks.emplace(id, std::move(hook));
  return id;
}

void remove_write_hook(std::uint64_t id) {
  Output& state = output();
  std::lock_guard lock(state.hooks_mutex);
  state.hooks.erase(id);
}

std::optional<std::filesystem::path> output_file() {
  Output& state = output();
  std::lock_guard lock(state.mutex);
  return state.file;
}

}  // namespace braid::trace
