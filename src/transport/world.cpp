#include <algorithm>
#include <array>
#include <exception>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>
#include <braid/core/excerpt.hpp>
#include <braid/core/log.hpp>
#include <braid/trace/output.hpp>
#include <braid/transport/world.hpp>

#include "transport/clock_alignment.hpp"
#include "transport/join_wait.hpp"
#include "transport/machine_identity.hpp"
#include "transport/ptrace_permission.hpp"
#include "transport/rank_claim.hpp"
#include "transport/world_keys.hpp"

namespace braid::transport {
namespace {

using detail::address_key;
using detail::Event;
using detail::gone_key;
using detail::kEventsKey;
using detail::left_key;

// How a failure caused by another names it, so that a chain of them names the first.
constexpr std::string_view kAfterRank = ", after rank ";
// How much of a noted error an announcement quotes: a collective's error with both
// fingerprints fits.
constexpr std::size_t kNotedErrorBytes = 600;

// A published address: the publishing rank's node (4 bytes, little-endian) and then its
// UCX worker address.
Bytes with_node(int node, const Bytes& address) {
  Bytes published;
  published.reserve(4 + address.size());
  for (int i = 0; i < 4; ++i) published.push_back(static_cast<std::uint8_t>(node >> (8 * i)));
  for (std::uint8_t byte : address) published.push_back(byte);
  return published;
}

// Splits what with_node() made: returns the node and leaves the UCX address in `published`.
int take_node(Bytes& published, int rank) {
  if (published.size() < 4) {
    throw Error(Errc::protocol_error,
                fmt::format("rank {} published a {}-byte address; is it running another build "
                            "of braid?",
                            rank, published.size()),
                {.peer = rank, .operation = "World::join"});
  }
  std::uint32_t node = 0;
  for (int i = 0; i < 4; ++i)
    node |= std::uint32_t{published[static_cast<std::size_t>(i)]} << (8 * i);
  published.erase(published.begin(), published.begin() + 4);
  return static_cast<int>(node);
}

// Listen on every interface of the store host's family, so ranks on other nodes reach it.
std::string listen_host_for(const std::string& store_host) {
  return store_host.find(':') != std::string::npos ? "::" : "0.0.0.0";
}

// The launchers' block of ranks per node, for naming the nodes of ranks that never join;
// 0 on one node or where the blocks do not tile the world.
int ranks_per_node(const LaunchInfo& info) {
  const bool blocks =
      info.num_nodes > 1 &&
      static_cast<long long>(info.num_nodes) * info.local_world_size == info.world_size;
  return blocks ? info.local_world_size : 0;
}

// See machine_identity.hpp. Before UCX starts, since what it may use depends on it.
struct Placement {
  bool network_only = false;        // keep UCX to its network transports
  std::vector<std::string> places;  // where each rank runs, for failure messages
};

asio::awaitable<Placement> check_placement(StoreClient& store, const LaunchInfo& info,
                                           Deadline deadline, const WorldOptions& options) {
  co_await store.set(
      detail::placement_key(info.rank),
      detail::encode_placement(info.node_rank, detail::MachineIdentity::of_this_process()));
  const std::vector<Bytes> published = co_await detail::await_published(
      store, info.world_size, ranks_per_node(info), detail::kPlacementRound, deadline, options);
  std::vector<int> nodes;
  std::vector<detail::MachineIdentity> machines;
  for (int r = 0; r < info.world_size; ++r) {
    auto [node, machine] = detail::decode_placement(published[static_cast<std::size_t>(r)], r);
    nodes.push_back(node);
    machines.push_back(std::move(machine));
  }
  const detail::PlacementCheck check = detail::check_placement(nodes, machines, info.rank);
  if (check.network_only && info.local_rank == 0) log::info("{}", check.why);
  co_return Placement{.network_only = check.network_only,
                      .places = detail::describe_places(nodes, machines)};
}

}  // namespace

// Lives on the runtime thread: set and read only there, so it needs no lock.
struct World::PeerWatch {
  bool stopped = false;
};

World::World(Runtime& runtime, LaunchInfo launch, Options options)
    : runtime_(runtime),
      launch_(std::move(launch)),
      options_(std::move(options)),
      watch_(std::make_shared<PeerWatch>()) {}

std::unique_ptr<World> World::join(Runtime& runtime, const LaunchInfo& launch, Options options) {
  BRAID_ENFORCE(!runtime.on_runtime_thread(),
                "World::join blocks; call it from another thread or co_await async_join");
  return runtime.spawn(async_join(runtime, launch, std::move(options))).get();
}

asio::awaitable<std::unique_ptr<World>> World::async_join(Runtime& runtime, LaunchInfo launch,
                                                          Options options) {
  log::set_process_rank(launch.rank);
  // What this rank read from its launcher's environment: a warning on any rank where another
  // launcher's variables say otherwise, since that is where a wrong layout starts; at info
  // on rank 0 (once per job); at debug elsewhere.
  if (!launch.description.empty()) {
    const log::Level level = outranked_disagree(launch) ? log::Level::warn
                             : launch.rank == 0         ? log::Level::info
                                                        : log::Level::debug;
    if (log::enabled(level)) log::write(level, "launch environment: " + describe(launch));
  }
  // BRAID_TRACE: recording starts now, so joining is on the timeline too.
  const std::string trace_directory = config::string_value("BRAID_TRACE");
  (void)trace::clock_source();  // a malformed BRAID_TRACE_CLOCK is an error here, at join
  if (const std::int64_t mib = config::int_value("BRAID_TRACE_BUFFER_MB"); mib <= 0) {
    throw Error(Errc::invalid_environment,
                fmt::format("BRAID_TRACE_BUFFER_MB={} must be a positive number of MiB", mib),
                {.operation = "join"});
  }
  if (!trace_directory.empty()) trace::set_enabled(true);
  const Deadline deadline = deadline_after(options.join_timeout.value_or(default_timeout()));
  std::unique_ptr<World> world(new World(runtime, std::move(launch), std::move(options)));
  const LaunchInfo& info = world->launch_;

  std::uint16_t store_port = info.store_port;
  // An etcd cluster, or braid-run, serves the store for the job's life; else rank 0 does.
  if (info.rank == 0 && !info.store_served_by_launcher && info.etcd_members.empty()) {
    // The store serves on a thread of its own, so what its clients send (strangers
    // included) never queues ahead of this rank's communication on the runtime thread.
    world->store_runtime_ = std::make_unique<Runtime>(
        Runtime::Options{.rank = info.rank, .thread_name = "braid-store"});
    world->server_ = std::make_unique<StoreServer>(
        *world->store_runtime_, StoreServer::Options{.host = listen_host_for(info.store_host),
                                                     .port = info.store_port,
                                                     .token = info.token});
    store_port = world->server_->port();
    log::debug("serving the store on port {}", store_port);
  }
  // A named argument, not a braced temporary: GCC 12 destroys a braced temporary passed
  // by value to a coroutine twice.
  StoreAddress store_address{.host = info.store_host,
                             .port = store_port,
                             .token = info.token,
                             .key_prefix = info.store_prefix,
                             .etcd_members = info.etcd_members,
                             .etcd_namespace = info.etcd_namespace};
  world->store_ = co_await detail::connect_to_store(runtime.executor(), std::move(store_address),
                                                    deadline, world->options_);
  // A second process given a rank already taken is refused here, before its will or its
  // address could stand in for the real rank's.
  co_await claim_rank(*world->store_, info.rank);
  // From here on this rank's death -- even one during the rest of the join -- is announced.
  std::string events_key = kEventsKey;
  Bytes will = detail::will_value(info.rank);
  co_await world->store_->set_appending_will(std::move(events_key), std::move(will));

  Placement placement;
  if (info.num_nodes > 1) {
    placement = co_await check_placement(*world->store_, info, deadline, world->options_);
    world->options_.ucx.network_only = placement.network_only;
    // Across nodes joined by TCP alone, large messages go eagerly (UcxWorker::Options).
    if (!detail::has_rdma_devices()) world->options_.ucx.eager_messages = true;
  }
  // Shared memory for small messages is safe now: the watcher (watch_peers) notices a
  // killed peer that UCX's shared-memory keepalive misses.
  world->options_.ucx.shared_memory_peer_errors = true;
  // Before UCX opens its cma transport and before any arena probes cross-memory attach.
  detail::let_siblings_attach();
  world->ucx_ = std::make_unique<UcxWorker>(runtime, world->options_.ucx);
  // Each rank publishes its node with its address, so the job learns where every rank
  // runs (hierarchical collectives need it) without another round of store traffic.
  co_await world->store_->set(address_key(info.rank),
                              with_node(info.node_rank, world->ucx_->address()));
  std::vector<Bytes> addresses =
      co_await detail::await_published(*world->store_, info.world_size, ranks_per_node(info),
                                       detail::kAddressRound, deadline, world->options_);
  world->node_of_rank_.resize(static_cast<std::size_t>(info.world_size));
  for (int r = 0; r < info.world_size; ++r) {
    world->node_of_rank_[static_cast<std::size_t>(r)] =
        take_node(addresses[static_cast<std::size_t>(r)], r);
  }
  std::optional<Error> connect_error;
  try {
    world->ucx_->connect(addresses, info.rank);
    if (!placement.places.empty()) world->ucx_->set_peer_places(std::move(placement.places));
  } catch (const Error& e) {
    connect_error = e;
  }
  if (connect_error) {
    // A peer that died as we connected to it breaks the connect with UCX's words (a shared
    // memory segment gone); its will says which rank it was, if it has fired by now.
    std::string first_event = detail::event_key(0);
    Bytes value;
    try {
      value = co_await world->store_->get(std::move(first_event),
                                          deadline_after(std::chrono::milliseconds(200)));
    } catch (const Error&) {
      // No failure on record: UCX's error is all there is to say.
    }
    const Event event = value.empty() ? Event{} : detail::event_in(value);
    if (event.kind != Event::Kind::failed || event.rank < 0) throw *connect_error;
    throw detail::failed_while_joining(event, {.rank = info.rank, .operation = "World::join"},
                                       connect_error->detail());
  }
  world->ended_.resize(static_cast<std::size_t>(info.world_size));
  // Whatever detects it (UCX, a will, an announcement), the first peer failure is what a
  // failure of this rank's own names as its cause.
  world->failure_recorder_ =
      world->ucx_->add_peer_failure_listener([w = world.get()](int peer, const std::string& why) {
        if (!w->first_failure_) w->first_failure_ = SeenFailure{.rank = peer, .why = why};
      });
  if (!trace_directory.empty()) co_await world->start_trace_output(trace_directory, deadline);
  asio::co_spawn(runtime.executor(), world->watch_peers(world->watch_), asio::detached);
  log::info("joined a world of {} rank(s) (launched by {}, store {})", info.world_size, info.source,
            info.etcd_members.empty() ? format_host_port(info.store_host, store_port)
                                      : format_etcd_url({info.etcd_members, info.etcd_namespace}));
  co_return world;
}

asio::awaitable<void> World::start_trace_output(std::string directory, Deadline deadline) {
  trace::TraceIdentity identity{.rank = rank(), .world_size = size()};
  identity.clock = co_await clock_alignment(deadline);
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) == 0) identity.host = host.data();
  log::debug("tracing to {} (clock offset against rank 0: {} ns, round trip {} ns)", directory,
             identity.clock.offset_ns, identity.clock.round_trip_ns);
  try {
    trace::set_output(directory, std::move(identity));
  } catch (const Error& e) {
    throw Error(Errc::invalid_environment, fmt::format("BRAID_TRACE: {}", e.detail()),
                {.rank = rank(), .operation = "World::join"});
  }
  writes_trace_ = true;
}

asio::awaitable<trace::ClockAlignment> World::clock_alignment(Deadline deadline) {
  if (!clock_) clock_ = co_await detail::align_clocks(*ucx_, deadline);
  co_return *clock_;
}

asio::awaitable<void> World::watch_peers(std::shared_ptr<PeerWatch> watch) {
  // Follows the job's events one get at a time: each waits on the server, costing nothing
  // while every rank runs, and is re-issued only when its (far) deadline passes.
  constexpr auto kRearmAfter = std::chrono::hours(24);
  for (std::int64_t next = 0;;) {
    Bytes value;
    std::optional<Error> lost;
    try {
      value = co_await store_->get(detail::event_key(next), deadline_after(kRearmAfter));
    } catch (const Error& e) {
      lost = e;
    }
    // Stopped: the World is leaving or gone (its client's destruction ends our get with
    // Errc::closed), and nothing of it may be touched.
    if (watch->stopped) co_return;
    if (!lost) {
      ++next;
      on_event(value);
      continue;
    }
    if (lost->code() == Errc::timeout) continue;
    // The connection to the store broke: whoever serves it (rank 0, or braid-run on node
    // 0, whose ranks die with it) is gone, or unreachable, which leaves us as stuck as if it
    // were.
    if (launch_.store_served_by_launcher || !launch_.etcd_members.empty()) {
      std::string reason = fmt::format(
          "the store {} stopped answering ({})",
          launch_.etcd_members.empty() ? "braid-run serves on node 0" : "(an etcd cluster)",
          lost->detail());
      for (int peer = 0; peer < size(); ++peer) {
        if (peer != rank()) ucx_->fail_peer(peer, reason, UcxWorker::PeerLoss::gone);
      }
    } else if (rank() == 0) {
      log::warn("lost the connection to this rank's own store: {}", lost->what());
    } else {
      std::string reason =
          fmt::format("the store it serves stopped answering ({})", lost->detail());
      ucx_->fail_peer(0, std::move(reason), UcxWorker::PeerLoss::gone);
    }
    co_return;
  }
}

void World::on_event(const Bytes& value) {
  Event event = detail::event_in(value);
  if (event.rank < 0 || event.rank >= size()) {
    log::warn("the job's events hold {} bytes that name no rank; ignored", value.size());
    return;
  }
  if (event.rank == rank()) return;  // this rank's own: it is leaving
  if (event.kind == Event::Kind::failed) {
    ucx_->fail_peer(event.rank, std::move(event.why), UcxWorker::PeerLoss::gone);
    return;
  }
  try {
    ended_[static_cast<std::size_t>(event.rank)] = decode_issued_work(event.work);
  } catch (const Error& e) {
    log::warn("rank {} left with issued work this rank cannot read ({}); ignored", event.rank,
              e.detail());
    return;
  }
  log::debug("rank {} left the job cleanly", event.rank);
  const auto listeners = ended_listeners_;  // a listener may remove itself
  for (const auto& [id, listener] : listeners) {
    listener(event.rank, *ended_[static_cast<std::size_t>(event.rank)]);
  }
}

std::uint64_t World::add_issued_work_source(IssuedWorkSource source) {
  return runtime_.run([&] {
    work_sources_.emplace_back(next_observer_id_, std::move(source));
    return next_observer_id_++;
  });
}

void World::retire_issued_work_source(std::uint64_t id) {
  runtime_.run([&] {
    const auto source = std::find_if(work_sources_.begin(), work_sources_.end(),
                                     [id](const auto& e) { return e.first == id; });
    if (source == work_sources_.end()) return;
    CommunicatorWork last = source->second();
    work_sources_.erase(source);
    std::erase_if(retired_work_,
                  [&](const CommunicatorWork& w) { return w.communicator == last.communicator; });
    retired_work_.push_back(std::move(last));
  });
}

std::uint64_t World::add_peer_ended_listener(PeerEndedListener listener) {
  return runtime_.run([&] {
    ended_listeners_.emplace_back(next_observer_id_, std::move(listener));
    return next_observer_id_++;
  });
}

void World::remove_peer_ended_listener(std::uint64_t id) {
  runtime_.run(
      [&] { std::erase_if(ended_listeners_, [id](const auto& e) { return e.first == id; }); });
}

void World::note_error(const std::string& what) {
  if (noted_error_.empty()) noted_error_ = what;
}

const IssuedWork* World::peer_ended(int peer) const {
  const auto& work = ended_.at(static_cast<std::size_t>(peer));
  return work ? &*work : nullptr;
}

asio::awaitable<Bytes> World::get_from(int peer, std::string key, Deadline deadline) {
  // Touched only on the runtime thread; the get cannot be withdrawn, so it may run on to its
  // end after we have gone (it then touches only `waiting`).
  struct Waiting {
    explicit Waiting(const asio::any_io_executor& e) : wake(e) {}
    asio::steady_timer wake;  // cancelled by the peer leaving or failing, or the get's end
    bool finished = false;
    std::exception_ptr error;
    Bytes value;
  };
  const asio::any_io_executor executor = runtime_.executor();
  auto waiting = std::make_shared<Waiting>(executor);
  const auto wake_for = [waiting, peer](int who) {
    if (who == peer) waiting->wake.cancel();
  };
  const std::uint64_t failures =
      ucx_->add_peer_failure_listener([wake_for](int who, const std::string&) { wake_for(who); });
  const std::uint64_t endings =
      add_peer_ended_listener([wake_for](int who, const IssuedWork&) { wake_for(who); });
  struct Unlisten {
    World& world;
    std::uint64_t failures, endings;
    ~Unlisten() {
      world.ucx_->remove_peer_failure_listener(failures);
      world.remove_peer_ended_listener(endings);
    }
  } unlisten{*this, failures, endings};
  std::string get_key = key;
  asio::co_spawn(executor, store_->get(std::move(get_key), deadline),
                 [waiting](std::exception_ptr error, Bytes value) {
                   waiting->finished = true;
                   waiting->error = error;
                   waiting->value = std::move(value);
                   waiting->wake.cancel();
                 });
  const bool gone_already = ucx_->peer_failure(peer) || peer_ended(peer) != nullptr;
  if (!gone_already) {
    waiting->wake.expires_at(Clock::time_point::max());
    boost::system::error_code ignored;
    co_await waiting->wake.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
  if (waiting->finished) {
    if (waiting->error) std::rethrow_exception(waiting->error);
    co_return std::move(waiting->value);
  }
  // The peer is gone. Had it set the key, the store saw the set before its leave or its
  // will (which we have seen), so a get now answers within a round trip; one that does not
  // never will. The short deadline is only that round trip's allowance.
  const std::optional<std::string> failure = ucx_->peer_failure(peer);
  std::string again = key;
  try {
    co_return co_await store_->get(
        std::move(again), std::min(deadline, deadline_after(std::chrono::milliseconds(200))));
  } catch (const Error& e) {
    if (e.code() != Errc::timeout) throw;
  }
  throw Error(Errc::peer_failed,
              fmt::format("rank {} {} before setting '{}', which this rank waits for", peer,
                          failure ? fmt::format("failed ({})", *failure)
                                  : std::string("ended its program (left the job)"),
                          key),
              {.rank = rank(), .peer = peer, .operation = "store.get"});
}

asio::awaitable<void> World::wait_for_live_ranks(std::string (*key_of)(int), Deadline deadline) {
  // Touched only on the runtime thread. A store wait cannot be withdrawn, so one a failure
  // overtook runs on to its end unheeded (`round` tells it apart).
  struct Waiting {
    explicit Waiting(const asio::any_io_executor& e) : wake(e) {}
    asio::steady_timer wake;  // cancelled by a peer's failure or the current wait's end
    int round = 0;            // the current wait
    bool finished = false;    // it ended
    std::exception_ptr error;
  };
  const asio::any_io_executor executor = runtime_.executor();
  auto waiting = std::make_shared<Waiting>(executor);
  // UcxWorker's listeners hear every detector: UCX, the watcher's wills and announcements.
  const std::uint64_t listener = ucx_->add_peer_failure_listener(
      [waiting](int, const std::string&) { waiting->wake.cancel(); });
  struct Unlisten {
    UcxWorker& ucx;
    std::uint64_t id;
    ~Unlisten() { ucx.remove_peer_failure_listener(id); }
  } unlisten{*ucx_, listener};
  for (;;) {
    std::vector<std::string> keys;
    for (int r = 0; r < size(); ++r) {
      if (r == rank() || !ucx_->peer_failure(r)) keys.push_back(key_of(r));
    }
    const int round = ++waiting->round;
    waiting->finished = false;
    asio::co_spawn(executor, store_->wait(std::move(keys), deadline),
                   [waiting, round](std::exception_ptr error) {
                     if (waiting->round != round) return;
                     waiting->finished = true;
                     waiting->error = error;
                     waiting->wake.cancel();
                   });
    waiting->wake.expires_at(Clock::time_point::max());
    boost::system::error_code ignored;
    co_await waiting->wake.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
    if (!waiting->finished) continue;  // a rank failed: wait again, for those still alive
    if (waiting->error) std::rethrow_exception(waiting->error);
    co_return;
  }
}

// Two phases. (1) Every live rank waits until every live rank has started leaving: a
// rank that tore its UCX worker down while a slower peer was still connecting to it
// (endpoints are created eagerly) or still draining its messages would fail that peer.
// (2) Rank 0, whose runtime serves the store, keeps serving until every live rank has seen
// phase 1 complete. A rank known to have failed is waited for in neither: it will never
// come, and waiting for it would keep every survivor for the whole leave timeout.
asio::awaitable<void> World::leave(bool after_error) {
  const Deadline deadline = deadline_after(options_.leave_timeout);
  // Named arguments, not braced temporaries, in co_await (the GCC 12 pitfall; see
  // async_join).
  Bytes no_value;
  if (after_error) {
    // Peers still waiting on this rank in a collective learn now that it will never come,
    // as they would from its will had it died (announce_failure() may have told them).
    if (!failure_announced_) {
      // A named argument, not a temporary, in co_await (the GCC 12 pitfall; see async_join).
      std::string why =
          noted_error_.empty()
              ? std::string("it left the job through an error (its own output says which)")
              : fmt::format("it left the job through an error: {}",
                            excerpt(noted_error_, kNotedErrorBytes));
      co_await announce(std::move(why));
    }
  } else {
    // Peers learn what this rank issued, and fail at once what it never will.
    IssuedWork work;
    for (const auto& [id, source] : work_sources_) work.push_back(source());
    for (const CommunicatorWork& retired : retired_work_) {
      const bool live = std::any_of(work.begin(), work.end(), [&](const CommunicatorWork& w) {
        return w.communicator == retired.communicator;
      });
      if (!live) work.push_back(retired);
    }
    std::string events_key = kEventsKey;
    Bytes event = detail::ended_event(rank(), encode_issued_work(work));
    co_await store_->append(std::move(events_key), std::move(event));
  }
  // Withdrawn before the barrier, so that a clean exit never reads as a death: past it,
  // ranks close their store connections (and rank 0 its store).
  co_await store_->clear_will();
  co_await store_->set(left_key(rank()), no_value);
  // The watcher runs on through phase 1: a rank that dies now is a failure, and its will
  // stops the wait for it.
  co_await wait_for_live_ranks(&left_key, deadline);
  watch_->stopped = true;
  co_await store_->set(gone_key(rank()), no_value);
  if (rank() == 0) co_await wait_for_live_ranks(&gone_key, deadline);
}

asio::awaitable<void> World::announce(std::string why) {
  // Caused by a peer's failure: name it, or, when that failure was itself caused by
  // another, the one that began the chain, so every survivor can name the first.
  if (first_failure_) {
    const std::string& cause = first_failure_->why;
    const auto chained = cause.find(kAfterRank);
    why += chained != std::string::npos
               ? cause.substr(chained)
               : fmt::format("{}{} failed: {}", kAfterRank, first_failure_->rank, cause);
  }
  std::string key = kEventsKey;
  Bytes event = detail::failure_event(rank(), why);
  co_await store_->append(std::move(key), std::move(event));
}

void World::announce_failure(const std::string& why) {
  if (!store_ || runtime_.on_runtime_thread()) return;
  failure_announced_ = true;
  try {
    runtime_.spawn(announce(why)).get();
  } catch (const std::exception& e) {
    log::warn("announcing this rank's failure ({}): {}", why, e.what());
  }
}

World::~World() {
  // Destroyed while an exception unwinds, or after announce_failure(): the program is
  // leaving through an error.
  const bool after_error = std::uncaught_exceptions() > 0 || failure_announced_;
  // Only when the world finished joining (a failed join never reaches here) and we are
  // not on the runtime thread, where waiting would deadlock.
  if (store_ && !runtime_.on_runtime_thread()) {
    try {
      runtime_.spawn(leave(after_error)).get();
    } catch (const std::exception& e) {
      // A dead rank 0 took the store with it: the failure was reported already.
      const bool store_gone =
          rank() != 0 && runtime_.run([this] { return ucx_->peer_failure(0).has_value(); });
      if (store_gone) {
        log::debug("leaving the world without rank 0's store: {}", e.what());
      } else {
        log::warn("leaving the world: {}", e.what());
      }
    }
  }
  // The watcher stops, if leaving has not stopped it: from here on, ranks leaving and the
  // store closing are expected, not failures.
  runtime_.run([this] {
    watch_->stopped = true;
    if (ucx_) ucx_->remove_peer_failure_listener(failure_recorder_);
  });
  // Destroy in reverse order of use: endpoints first, then the store client, then the
  // server other ranks may have been reading from until the leave barrier.
  ucx_.reset();
  store_.reset();
  server_.reset();
  store_runtime_.reset();
  if (writes_trace_) {
    try {
      trace::write();
    } catch (const std::exception& e) {
      log::warn("writing the trace: {}", e.what());
    }
  }
}

Tag World::world_tag(std::uint64_t tag) noexcept {
  return Tag{.communicator = 0,
             .sequence = tag >> tag_step_bits,
             .step = static_cast<std::uint32_t>(tag & ((std::uint64_t{1} << tag_step_bits) - 1))};
}

// Not coroutines: they hand back the transport's awaitable, one coroutine frame fewer per
// message.
asio::awaitable<void> World::send(int peer, Buffer buffer, std::uint64_t tag, Deadline deadline) {
  return ucx_->send(peer, buffer, world_tag(tag), deadline);
}

asio::awaitable<std::size_t> World::recv(int peer, Buffer buffer, std::uint64_t tag,
                                         Deadline deadline) {
  return ucx_->recv(peer, buffer, world_tag(tag), deadline);
}

}  // namespace braid::transport
