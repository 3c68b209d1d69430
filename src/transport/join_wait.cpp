#include "transport/join_wait.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/core/log.hpp>
#include <braid/transport/bootstrap.hpp>

#include "transport/rank_list.hpp"
#include "transport/world_keys.hpp"

namespace braid::transport::detail {
namespace {

// " (node 1's, by the launchers' numbering)": the nodes whose ranks are missing, where the
// launchers numbered ranks in blocks of `ranks_per_node`; empty where they did not.
std::string nodes_of(const std::vector<int>& ranks, int ranks_per_node) {
  if (ranks_per_node <= 0) return {};
  std::vector<int> nodes;
  for (int rank : ranks) {
    if (nodes.empty() || nodes.back() != rank / ranks_per_node) {
      nodes.push_back(rank / ranks_per_node);
    }
  }
  return fmt::format(" ({} {}'s, by the launchers' numbering)",
                     nodes.size() == 1 ? "node" : "nodes", list_ranks(nodes));
}

// What bounds the join, for messages: the program's join timeout or BRAID_TIMEOUT.
std::string join_bound(const WorldOptions& options, Clock::duration timeout) {
  const double seconds = std::chrono::duration<double>(timeout).count();
  return options.join_timeout ? fmt::format("the join timeout of {:g} s", seconds)
                              : fmt::format("BRAID_TIMEOUT={:g} s", seconds);
}

// How often a join still waiting says for whom: every 10 s, or three times within a
// shorter timeout, so a short BRAID_TIMEOUT still shows progress before it fails.
Clock::duration report_interval(Clock::duration timeout) {
  return std::min<Clock::duration>(std::chrono::seconds(10), timeout / 3);
}

// Says every `every` that this rank still waits for the store, until `done`.
struct StoreWaitReport {
  explicit StoreWaitReport(const asio::any_io_executor& e) : timer(e) {}
  asio::steady_timer timer;  // cancelled when done
  bool done = false;
};

asio::awaitable<void> report_store_wait(std::shared_ptr<StoreWaitReport> report, std::string where,
                                        Clock::duration every) {
  const auto started = Clock::now();
  while (!report->done) {
    report->timer.expires_after(every);
    boost::system::error_code ignored;
    co_await report->timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
    if (report->done) break;
    log::warn("still waiting for the job's store at {} ({:.1f} s so far)", where,
              std::chrono::duration<double>(Clock::now() - started).count());
  }
}

}  // namespace

asio::awaitable<std::unique_ptr<StoreClient>> connect_to_store(asio::any_io_executor executor,
                                                               StoreAddress address,
                                                               Deadline deadline,
                                                               const WorldOptions& options) {
  const Clock::duration timeout = options.join_timeout.value_or(default_timeout());
  const bool etcd = !address.etcd_members.empty();
  const std::string where = etcd ? format_etcd_url({address.etcd_members, address.etcd_namespace})
                                 : format_host_port(address.host, address.port);
  auto report = std::make_shared<StoreWaitReport>(executor);
  asio::co_spawn(executor, report_store_wait(report, where, report_interval(timeout)),
                 asio::detached);
  struct Stop {
    StoreWaitReport& report;
    ~Stop() {
      report.done = true;
      report.timer.cancel();
    }
  } stop{*report};
  try {
    co_return co_await StoreClient::connect(executor, std::move(address), deadline);
  } catch (const Error& e) {
    if (e.code() != Errc::timeout) throw;
    throw Error(Errc::timeout,
                fmt::format("{}: {} (bounded by {})",
                            etcd ? "no member of the job's etcd cluster answered"
                                 : "rank 0 never served the store",
                            e.detail(), join_bound(options, timeout)),
                e.context());
  }
}

asio::awaitable<std::vector<Bytes>> await_published(StoreClient& store, int world_size,
                                                    int ranks_per_node, JoinRound round,
                                                    Deadline deadline,
                                                    const WorldOptions& options) {
  const Clock::duration timeout = options.join_timeout.value_or(default_timeout());
  const std::string bound = join_bound(options, timeout);
  const asio::any_io_executor executor = co_await asio::this_coro::executor;
  // Touched only on the runtime thread, by this coroutine and the gets' completions.
  struct Arrivals {
    Arrivals(const asio::any_io_executor& e, int n)
        : wake(e), addresses(static_cast<std::size_t>(n)) {}
    asio::steady_timer wake;  // cancelled by every completion
    std::vector<std::optional<Bytes>> addresses;
    int outstanding = 0;          // address gets not finished
    std::exception_ptr failure;   // the first get that failed other than by timing out
    std::optional<Bytes> failed;  // the job's first event, once it is a failure
  };
  auto arrivals = std::make_shared<Arrivals>(executor, world_size);
  for (int r = 0; r < world_size; ++r) {
    ++arrivals->outstanding;
    asio::co_spawn(executor, store.get(round.key_of(r), deadline),
                   [arrivals, r](std::exception_ptr error, Bytes value) {
                     --arrivals->outstanding;
                     if (!error) {
                       arrivals->addresses[static_cast<std::size_t>(r)] = std::move(value);
                     } else if (!arrivals->failure) {
                       try {
                         std::rethrow_exception(error);
                       } catch (const Error& e) {
                         if (e.code() != Errc::timeout) arrivals->failure = error;
                       } catch (...) {
                         arrivals->failure = error;
                       }
                     }
                     arrivals->wake.cancel();
                   });
  }
  // The job's first event: a failure ends the join (a clean leave can come first only once
  // every address is in, when the join is over anyway). Outlives the join when nobody
  // dies; its completion touches only `arrivals`.
  asio::co_spawn(executor, store.get(event_key(0), deadline),
                 [arrivals](std::exception_ptr error, Bytes value) {
                   const Event event = error ? Event{} : event_in(value);
                   if (event.kind == Event::Kind::failed && event.rank >= 0) {
                     arrivals->failed = std::move(value);
                   }
                   arrivals->wake.cancel();
                 });
  auto missing = [&arrivals] {
    std::vector<int> ranks;
    for (std::size_t r = 0; r < arrivals->addresses.size(); ++r) {
      if (!arrivals->addresses[r]) ranks.push_back(static_cast<int>(r));
    }
    return ranks;
  };
  const auto started = Clock::now();
  const Clock::duration every = report_interval(timeout);
  auto next_report = started + every;
  while (arrivals->outstanding > 0 && !arrivals->failure && !arrivals->failed) {
    arrivals->wake.expires_at(next_report);
    boost::system::error_code ignored;
    co_await arrivals->wake.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
    if (const auto now = Clock::now(); now >= next_report && now < deadline) {
      const std::vector<int> absent = missing();
      if (!absent.empty()) {
        log::warn("waiting for rank(s) {} of {} to join ({:.1f} s of {})", list_ranks(absent),
                  world_size, std::chrono::duration<double>(now - started).count(), bound);
      }
      next_report = now + every;
    }
  }
  if (arrivals->failed) {
    throw failed_while_joining(event_in(*arrivals->failed), {.operation = "World::join"});
  }
  if (arrivals->failure) std::rethrow_exception(arrivals->failure);
  if (const std::vector<int> absent = missing(); !absent.empty()) {
    const bool one = absent.size() == 1;
    throw Error(Errc::timeout,
                fmt::format("{} {} of {}{} never joined: {} ('{}'{}) {} not in the store within "
                            "{}; {} started, with this job's BRAID_STORE and BRAID_TOKEN?",
                            one ? "rank" : "ranks", list_ranks(absent), world_size,
                            nodes_of(absent, ranks_per_node), one ? round.one : round.several,
                            round.key_of(absent.front()), one ? "" : ", ...", one ? "was" : "were",
                            bound, one ? "was it" : "were they"),
                {.operation = "World::join"});
  }
  std::vector<Bytes> addresses;
  for (auto& address : arrivals->addresses) addresses.push_back(std::move(*address));
  co_return addresses;
}

Error failed_while_joining(const Event& failed, const ErrorContext& context,
                           std::string_view also) {
  ErrorContext named = context;
  named.peer = failed.rank;
  return Error(Errc::peer_failed,
               also.empty() ? fmt::format("rank {} failed while the job was joining: {}",
                                          failed.rank, failed.why)
                            : fmt::format("rank {} failed while the job was joining: {} ({})",
                                          failed.rank, failed.why, also),
               std::move(named));
}

}  // namespace braid::transport::detail
