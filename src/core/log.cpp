#include <array>
#include <atomic>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/core/log.hpp>

namespace braid::log {
namespace {

constexpr std::array<std::string_view, 7> kLevelNames{"trace", "debug",    "info", "warn",
                                                      "error", "critical", "off"};

Level parse_level(std::string_view text) {
  for (std::size_t i = 0; i < kLevelNames.size(); ++i) {
    if (kLevelNames[i] == text) return static_cast<Level>(i);
  }
  throw Error(Errc::invalid_environment,
              fmt::format("BRAID_LOG_LEVEL='{}' is not one of trace, debug, info, warn, error, "
                          "critical, off",
                          text));
}

Level level_from_env_or_warn() {
  try {
    return parse_level(config::string_value("BRAID_LOG_LEVEL"));
  } catch (const Error&) {
    return Level::warn;
  }
}

std::atomic<Level>& current_level() {
  static std::atomic<Level> level{level_from_env_or_warn()};
  return level;
}

std::atomic<int> process_rank{-1};
thread_local int thread_rank = -1;

spdlog::logger& logger() {
  static auto instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto created = std::make_shared<spdlog::logger>("braid", std::move(sink));
    created->set_pattern("[%H:%M:%S.%f] [%^%l%$] %v");
    created->set_level(spdlog::level::trace);  // filtering happens in enabled()
    return created;
  }();
  return *instance;
}

}  // namespace

void configure_from_env() {
  set_level(parse_level(config::string_value("BRAID_LOG_LEVEL")));
}
void set_level(Level level) {
  current_level().store(level, std::memory_order_relaxed);
}
Level level() {
  return current_level().load(std::memory_order_relaxed);
}
bool enabled(Level l) {
  return l != Level::off && l >= current_level().load(std::memory_order_relaxed);
}

void set_process_rank(int rank) {
  process_rank.store(rank, std::memory_order_relaxed);
}
void set_thread_rank(int rank) {
  thread_rank = rank;
}
int current_rank() {
  return thread_rank >= 0 ? thread_rank : process_rank.load(std::memory_order_relaxed);
}

void write(Level l, std::string_view message) {
  const int rank = current_rank();
  const auto spd_level = static_cast<spdlog::level::level_enum>(static_cast<int>(l));
  if (rank >= 0) {
    logger().log(spd_level, "[rank {}] {}", rank, message);
  } else {
    logger().log(spd_level, "[rank -] {}", message);
  }
}

}  // namespace braid::log
