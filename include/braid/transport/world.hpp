// World: this process's place in a job. Joining reads what the launcher left in the
// environment (bootstrap.hpp), serves the rendezvous store on rank 0 (store.hpp, on a
// thread of its own, "braid-store"), connects
// to it, publishes this rank's UCX address and connects a UCX worker to every rank
// (ucx_worker.hpp). It is the one object a program needs before it can talk to its peers.
//
//   braid::Runtime runtime;
//   auto world = braid::transport::World::join(runtime);     // from the environment
//   runtime.spawn([&]() -> asio::awaitable<void> {
//     co_await world->send(1, braid::Buffer(values), /*tag=*/7);
//   }()).get();
//
// Threading: join() and the destructor block, so call them from a thread other than the
// runtime's (main, typically); send() and recv() are awaited by coroutines on the runtime.
//
// Tracing: with BRAID_TRACE=dir, joining turns the recorder on, measures this rank's
// clock offset against rank 0 and sets dir as the trace output (trace/output.hpp); the
// destructor writes rank-<r>.trace.json there once the ranks have left.
//
// Leaving: the destructor is a barrier (bounded by Options::leave_timeout). No rank tears
// its UCX worker down until every live rank has started leaving, so a slower peer never
// finds it gone while still connecting or receiving, and rank 0 serves the store until
// every live rank is past the barrier. A rank known to have failed (UCX saw it go, its
// store will fired, or it announced its own failure) is not waited for, and one that
// fails during the wait stops being waited for then.
//
// Every exit is announced, in the store's log of the job's events, which every rank
// follows: a rank that dies, by its store will; a World destroyed while an exception
// unwinds (the program is leaving through an error), or after announce_failure(), by a
// failure naming the failure that caused it, if one did; a clean leave (the program ended:
// it returned, called exit, or ran fewer steps) by what it had issued on each communicator
// (issued_work.hpp). Peers still waiting on a failed rank fail at once, naming it; peers
// waiting on an operation a rank that left never issued fail at once, naming it and what it
// did issue (communicators do this, through the peer-ended listeners). Every failure, not
// only the first, reaches every rank, so a failure that causes another ends as fast as one.
//
// Joining waits for every rank's address until Options::join_timeout (BRAID_TIMEOUT):
// meanwhile it logs which ranks have not arrived, and at the deadline names them and the
// setting. A rank that reached the store and died before publishing its address fails
// the join at once, by its will.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include <braid/core/buffer.hpp>
#include <braid/core/deadline.hpp>
#include <braid/core/runtime.hpp>
#include <braid/trace/chrome_trace.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/issued_work.hpp>
#include <braid/transport/store/store.hpp>
#include <braid/transport/ucx/ucx_worker.hpp>

namespace braid::transport {

struct WorldOptions {
  // How long joining may take: ranks start in any order, so rank 1 may wait for rank
  // 0's store to come up. nullopt: BRAID_TIMEOUT.
  std::optional<Clock::duration> join_timeout;
  // How long the destructor waits for the other live ranks to leave.
  Clock::duration leave_timeout = std::chrono::seconds(30);
  UcxWorker::Options ucx;
};

class World {
 public:
  using Options = WorldOptions;

  // Joins the job described by `launch` (default: parse_launch_env()). Throws braid::Error:
  // invalid_environment from parsing, timeout when the store or a peer's address does not
  // appear in time (naming the ranks and the setting), peer_failed when a rank dies while
  // the job joins, refused for a wrong BRAID_TOKEN.
  static std::unique_ptr<World> join(Runtime& runtime, const LaunchInfo& launch,
                                     Options options = {});
  static std::unique_ptr<World> join(Runtime& runtime) {
    return join(runtime, parse_launch_env(), {});
  }
  static asio::awaitable<std::unique_ptr<World>> async_join(Runtime& runtime, LaunchInfo launch,
                                                            Options options);

  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const noexcept { return launch_.rank; }
  int size() const noexcept { return launch_.world_size; }
  const LaunchInfo& launch() const noexcept { return launch_; }
  Runtime& runtime() noexcept { return runtime_; }
  // The node world rank `rank` runs on, as its launcher said (LaunchInfo::node_rank). Ranks
  // on one node share memory and a fast link; hierarchical collectives group by it.
  int node_of(int rank) const { return node_of_rank_.at(static_cast<std::size_t>(rank)); }
  StoreClient& store() noexcept { return *store_; }
  UcxWorker& transport() noexcept { return *ucx_; }

  // Point-to-point on the world, for programs that are not collectives: `tag` tells
  // messages between the same pair of ranks apart (tags below 2^32 are all distinct).
  // World messages travel on communicator 0, which communicators never use. Errors and
  // resumption as UcxWorker::send / recv.
  asio::awaitable<void> send(int peer, Buffer buffer, std::uint64_t tag,
                             Deadline deadline = kDefaultDeadline);
  asio::awaitable<std::size_t> recv(int peer, Buffer buffer, std::uint64_t tag,
                                    Deadline deadline = kDefaultDeadline);

  // How this rank's steady clock relates to rank 0's (trace/chrome_trace.hpp): measured by
  // round trips the first time it is awaited, then kept. Collective on that first call:
  // every rank awaits it at the same point (joining with BRAID_TRACE set makes that first
  // call itself). Ranks of one node share their clock, so there the offset is within a few
  // microseconds of zero; across nodes it is what lines their timelines up.
  asio::awaitable<trace::ClockAlignment> clock_alignment(Deadline deadline = kDefaultDeadline);

  // The UCX tag a world message with user tag `tag` travels with.
  static Tag world_tag(std::uint64_t tag) noexcept;

  // Announces now that this rank is leaving through an error `why` (a phrase: "it raised
  // ValueError in Python"), for programs whose errors never unwind through C++ (a Python
  // exception reaching the interpreter's top): peers waiting on this rank fail at once,
  // naming it and `why`, and the destructor leaves as after an error. The first failure
  // announced in the job keeps the key. Not on the runtime thread; a store already gone is
  // logged, not thrown.
  void announce_failure(const std::string& why);

  // A store get of a key that rank `peer` sets (a name, an id it hands out), that knows
  // whom it waits for: when `peer` fails or leaves the job first, it fails at once with
  // Errc::peer_failed naming it and the key, unless the key was set before (a set travels
  // ahead of its rank's leave, so one more get tells). Errc::timeout at `deadline`. On the
  // runtime thread.
  asio::awaitable<Bytes> get_from(int peer, std::string key, Deadline deadline);

  // Notes an error an operation on this rank raised, one of its own making (a size
  // mismatch, a desync; not a peer's failure): if the rank then leaves through an error, its
  // announcement quotes the first such note, so peers that were waiting on it learn what
  // went wrong rather than only that something did. Runtime thread only.
  void note_error(const std::string& what);

  // What this rank issued, published when it leaves cleanly: each source (a communicator)
  // reports its own, read on the runtime thread as the World leaves. A source retired (its
  // communicator destroyed, as programs do before their World) is read once more then and
  // its last report kept, the latest per communicator id, so a rank that drops its
  // communicators and then leaves still tells its peers what it issued. From any thread.
  using IssuedWorkSource = std::function<CommunicatorWork()>;
  std::uint64_t add_issued_work_source(IssuedWorkSource source);
  void retire_issued_work_source(std::uint64_t id);
  // Calls `listener(peer, work)` on the runtime thread when a peer leaves cleanly while this
  // rank runs, with what the peer had issued. From any thread.
  using PeerEndedListener = std::function<void(int peer, const IssuedWork& work)>;
  std::uint64_t add_peer_ended_listener(PeerEndedListener listener);
  void remove_peer_ended_listener(std::uint64_t id);
  // What `peer` had issued when it left cleanly, or null while it has not. Runtime thread.
  const IssuedWork* peer_ended(int peer) const;

 private:
  struct PeerWatch;

  World(Runtime& runtime, LaunchInfo launch, Options options);
  // The barrier above; `after_error`: announce this rank's failure first.
  asio::awaitable<void> leave(bool after_error);
  // Appends this rank's failure to the job's events: `why`, and the failure that caused
  // it when this rank saw one first.
  asio::awaitable<void> announce(std::string why);
  // One event of the job's log, as the watcher reads it.
  void on_event(const Bytes& value);
  // Waits until `key_of(r)` is set for every rank r not known to have failed, re-counting
  // the ranks when one fails meanwhile.
  asio::awaitable<void> wait_for_live_ranks(std::string (*key_of)(int), Deadline deadline);
  // BRAID_TRACE: measures the clock offset against rank 0 and sets the trace output.
  asio::awaitable<void> start_trace_output(std::string directory, Deadline deadline);
  // Waits for a rank's will to fire and fails that rank; see "Dead peers" above. Touches
  // this World only while `watch` says it has not been stopped.
  asio::awaitable<void> watch_peers(std::shared_ptr<PeerWatch> watch);

  Runtime& runtime_;
  LaunchInfo launch_;
  Options options_;
  std::unique_ptr<Runtime> store_runtime_;  // rank 0 only: the store's own thread
  std::unique_ptr<StoreServer> server_;     // rank 0 only, served on store_runtime_
  std::unique_ptr<StoreClient> store_;
  std::unique_ptr<UcxWorker> ucx_;
  std::shared_ptr<PeerWatch> watch_;  // shared with watch_peers(), which may outlive us
  std::vector<int> node_of_rank_;     // world rank -> node, from what each rank published
  bool writes_trace_ = false;         // BRAID_TRACE was set: the destructor writes the trace
  std::atomic<bool> failure_announced_ = false;  // announce_failure(): leave as failed
  // Runtime thread only, from here down.
  struct SeenFailure {
    int rank = -1;
    std::string why;
  };
  std::optional<SeenFailure> first_failure_;      // the first peer failure this rank saw
  std::string noted_error_;                       // note_error()'s first
  std::uint64_t failure_recorder_ = 0;            // the UCX listener that records it
  std::vector<std::optional<IssuedWork>> ended_;  // by rank: peers that left cleanly
  std::vector<std::pair<std::uint64_t, IssuedWorkSource>> work_sources_;
  std::vector<CommunicatorWork> retired_work_;  // one per communicator id, the latest
  std::vector<std::pair<std::uint64_t, PeerEndedListener>> ended_listeners_;
  std::uint64_t next_observer_id_ = 1;
  std::optional<trace::ClockAlignment> clock_;  // once measured
};

}  // namespace braid::transport
