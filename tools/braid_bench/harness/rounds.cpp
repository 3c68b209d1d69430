#include "rounds.hpp"

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

namespace braid::bench {
namespace {

// The aggregate `cpu` line of /proc/stat: jiffies idle (idle + iowait) and in all.
struct CpuTimes {
  unsigned long long idle = 0;
  unsigned long long total = 0;
};

std::optional<CpuTimes> cpu_times() {
  std::ifstream stat("/proc/stat");
  std::string line;
  if (!std::getline(stat, line) || line.rfind("cpu ", 0) != 0) return std::nullopt;
  std::istringstream fields(line.substr(4));
  CpuTimes times;
  unsigned long long value = 0;
  for (int field = 0; fields >> value; ++field) {
    times.total += value;
    if (field == 3 || field == 4) times.idle += value;  // idle, iowait
  }
  return times;
}

}  // namespace

void wait_until_quiet() {
  constexpr auto kWindow = std::chrono::milliseconds(200);
  constexpr auto kLimit = std::chrono::seconds(10);
  const auto give_up = std::chrono::steady_clock::now() + kLimit;
  std::optional<CpuTimes> before = cpu_times();
  if (!before) return;  // no /proc/stat: nothing to wait for
  while (std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(kWindow);
    const std::optional<CpuTimes> after = cpu_times();
    if (!after) return;
    const unsigned long long total = after->total - before->total;
    if (total > 0 && 10 * (after->idle - before->idle) >= 9 * total) return;
    before = after;
  }
  std::cerr << "braid-bench: the CPUs stayed busy for " << kLimit.count()
            << " s; measuring anyway\n";
}

}  // namespace braid::bench
