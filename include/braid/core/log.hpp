// Logging. Every line carries the rank that wrote it: the thread's rank when a Runtime
// (or a test's rank thread) set one, else the process rank from bootstrap. The level
// comes from BRAID_LOG_LEVEL. spdlog does the writing; it stays out of public headers.
//
// Cost: a disabled level is one relaxed atomic load; arguments are not formatted.
#pragma once

#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace braid::log {

enum class Level { trace, debug, info, warn, error, critical, off };

// Reads BRAID_LOG_LEVEL; throws Error(invalid_environment) for an unknown level.
// Runtime's constructor calls it; logging before that uses the same value, or "warn"
// if it is malformed.
void configure_from_env();
void set_level(Level level);
Level level();
bool enabled(Level level);

// The rank printed in this process's lines, and an override for the calling thread
// (threads-as-ranks tests, a Runtime's progress thread). -1 clears.
void set_process_rank(int rank);
void set_thread_rank(int rank);
int current_rank();

void write(Level level, std::string_view message);

template <class... Args>
void trace(fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(Level::trace)) write(Level::trace, fmt::format(format, std::forward<Args>(args)...));
}
template <class... Args>
void debug(fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(Level::debug)) write(Level::debug, fmt::format(format, std::forward<Args>(args)...));
}
template <class... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(Level::info)) write(Level::info, fmt::format(format, std::forward<Args>(args)...));
}
template <class... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(Level::warn)) write(Level::warn, fmt::format(format, std::forward<Args>(args)...));
}
template <class... Args>
void error(fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(Level::error)) write(Level::error, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace braid::log
