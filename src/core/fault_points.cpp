#include <array>
#include <atomic>
#include <csignal>
#include <mutex>
#include <optional>
#include <string>
#include <unistd.h>

#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/core/fault_points.hpp>

namespace braid {
namespace {

constexpr std::array kNames{"forward", "bucket-reduction", "pipeline-send", "memory-copy",
                            "disk-write"};

struct Fault {
  FaultPoint point;
  std::int64_t pass;  // the n-th pass, from 1
};

// This process's rank as braid-run gives it; 0 where nothing does (one process).
std::int64_t this_rank() {
  const std::string rank = config::string_value("BRAID_RANK");
  return rank.empty() ? 0 : config::parse_int(rank, "BRAID_RANK");
}

// BRAID_FAULT, read once; nullopt when unset, in a restarted job, or on another rank.
std::optional<Fault> parse_fault() {
  const std::string text = config::string_value("BRAID_FAULT");
  if (text.empty()) return std::nullopt;
  if (config::int_value("BRAID_RESTART_COUNT") > 0) return std::nullopt;
  auto malformed = [&](std::string_view why) {
    return Error(Errc::invalid_environment,
                 fmt::format("BRAID_FAULT='{}' {}: it takes <point>:<n>:<rank>, <point> one of "
                             "forward, bucket-reduction, pipeline-send, memory-copy, disk-write",
                             text, why),
                 {.operation = "fault_point"});
  };
  const auto first = text.find(':');
  const auto second = first == std::string::npos ? first : text.find(':', first + 1);
  if (second == std::string::npos) throw malformed("has fewer than three parts");
  const std::string name = text.substr(0, first);
  std::optional<FaultPoint> point;
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (name == kNames[i]) point = static_cast<FaultPoint>(i);
  }
  if (!point) throw malformed(fmt::format("names no fault point '{}'", name));
  const std::int64_t pass =
      config::parse_int(text.substr(first + 1, second - first - 1), "BRAID_FAULT's <n>");
  const std::int64_t rank = config::parse_int(text.substr(second + 1), "BRAID_FAULT's <rank>");
  if (pass < 1) throw malformed("counts passes from 1");
  if (rank != this_rank()) return std::nullopt;
  return Fault{*point, pass};
}

std::once_flag parsed;
std::optional<Fault> fault;
std::atomic<bool> armed{true};  // false once no fault can fire in this process
std::array<std::atomic<std::int64_t>, kNames.size()> passes{};

}  // namespace

std::string_view fault_point_name(FaultPoint point) {
  return kNames[static_cast<std::size_t>(point)];
}

void fault_point(FaultPoint point) {
  if (!armed.load(std::memory_order_relaxed)) return;
  std::call_once(parsed, [] {
    try {
      fault = parse_fault();
    } catch (...) {
      armed.store(false);
      throw;
    }
    if (!fault) armed.store(false);
  });
  if (!fault || fault->point != point) return;
  if (passes[static_cast<std::size_t>(point)].fetch_add(1) + 1 == fault->pass) {
    const std::string said = fmt::format("BRAID_FAULT: rank {} dies at {} (pass {})\n", this_rank(),
                                         fault_point_name(point), fault->pass);
    ssize_t ignored = ::write(STDERR_FILENO, said.data(), said.size());
    static_cast<void>(ignored);
    ::kill(::getpid(), SIGKILL);
  }
}

}  // namespace braid
