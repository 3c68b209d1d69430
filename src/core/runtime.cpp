#include <cstring>
#include <future>
#include <optional>
#include <pthread.h>
#include <time.h>
#include <type_traits>

#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/core/heap_policy.hpp>
#include <braid/core/log.hpp>
#include <braid/core/runtime.hpp>

namespace braid {

Runtime::Runtime() : Runtime(Options{}) {}

namespace {

// The progress thread's CPU set: Options::cpus, else BRAID_RUNTIME_CPUS; nullopt: leave it.
std::optional<cpu_set_t> progress_cpus(const std::vector<int>& chosen, std::string& knob) {
  std::vector<int> cpus = chosen;
  knob = "Runtime::Options::cpus";
  if (cpus.empty()) {
    const std::string text = config::string_value("BRAID_RUNTIME_CPUS");
    if (text.empty()) return std::nullopt;
    cpus = config::parse_cpu_list(text, "BRAID_RUNTIME_CPUS");
    knob = "BRAID_RUNTIME_CPUS";
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) {
      throw Error(Errc::invalid_argument,
                  fmt::format("{} names CPU {}, which does not exist", knob, cpu),
                  {.operation = "runtime"});
    }
    CPU_SET(cpu, &set);
  }
  return set;
}

}  // namespace

Runtime::Runtime(Options options)
    : options_(std::move(options)), work_(asio::make_work_guard(io_)) {
  log::configure_from_env();
  apply_heap_policy();
  std::string knob;
  const std::optional<cpu_set_t> cpus = progress_cpus(options_.cpus, knob);
  struct Started {
    std::thread::id id;
    clockid_t cpu_clock;
    int affinity_error;  // pthread_setaffinity_np's, 0 when it worked or was not asked
  };
  std::promise<Started> started;
  auto started_future = started.get_future();
  thread_ = std::thread([this, &started, &cpus] {
    pthread_setname_np(pthread_self(), options_.thread_name.substr(0, 15).c_str());
    // The kernel refuses (EINVAL) a set with no CPU the process's cpuset allows; a CPU
    // outside the launching thread's own mask is fine (taskset -c 0 braid-run ... with
    // BRAID_RUNTIME_CPUS=1 puts compute on 0 and communication on 1).
    const int affinity_error =
        cpus ? pthread_setaffinity_np(pthread_self(), sizeof *cpus, &*cpus) : 0;
    if (options_.rank >= 0) log::set_thread_rank(options_.rank);
    clockid_t cpu_clock = CLOCK_THREAD_CPUTIME_ID;
    if (pthread_getcpuclockid(pthread_self(), &cpu_clock) != 0) cpu_clock = -1;
    started.set_value({std::this_thread::get_id(), cpu_clock, affinity_error});
    if (affinity_error != 0) return;
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        // A handler threw outside any coroutine that could carry the error to a caller.
        // Keep the runtime alive for everyone else, and say so loudly.
        log::error("unhandled exception on the runtime thread: {}", e.what());
      }
    }
  });
  const Started thread = started_future.get();
  thread_id_ = thread.id;
  progress_clock_ = thread.cpu_clock;
  if (thread.affinity_error != 0) {
    thread_.join();
    throw Error(Errc::invalid_argument,
                fmt::format("{} names no CPU this process may run on ({}; see taskset -p and "
                            "the cpuset of its cgroup)",
                            knob, std::strerror(thread.affinity_error)),
                {.operation = "runtime"});
  }
}

std::chrono::nanoseconds Runtime::progress_cpu_time() const {
  static_assert(std::is_same_v<clockid_t, int>, "progress_clock_ holds a clockid_t");
  timespec t{};
  if (progress_clock_ == -1 || clock_gettime(progress_clock_, &t) != 0) return {};
  return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
}

Runtime::~Runtime() {
  work_.reset();
  io_.stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace braid
