// Communicator's lifetime and dispatch: construction, submit() (a checked call takes its
// place in the order: sequence number, shared-memory turn) and run(), which exchanges
// fingerprints (BRAID_DEBUG=detail, fingerprints.cpp), runs the selected algorithm, puts the
// operation's name on any error and keeps the operations in flight, aborted when a member
// dies. The entry points that describe the calls are in communicator_entry_points.cpp; CUDA
// buffers take communicator_cuda.cpp's paths.
#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <braid/collectives/communicator.hpp>
#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/trace/span.hpp>
#include <braid/transport/world.hpp>

#include "collectives/algorithms/algorithms.hpp"
#include "collectives/call_checks.hpp"
#include "collectives/collective_call.hpp"
#include "collectives/collective_op.hpp"
#include "collectives/communicator_ids.hpp"
#include "collectives/communicator_internal.hpp"
#include "collectives/fingerprints.hpp"
#include "collectives/scratch_pool.hpp"
#include "collectives/shared_memory_arena.hpp"
#include "collectives/staging.hpp"

namespace braid::collectives {

using detail::CollectiveCall;
using detail::CollectiveOp;
using detail::memory_rule_of;
using detail::site_of;

namespace {

// Span names are the kinds' own names, interned once (intern() locks; a span must not).
trace::Name span_name(CollectiveKind kind) {
  static const auto names = [] {
    std::vector<trace::Name> interned;
    for (CollectiveKind k : all_collective_kinds) interned.push_back(trace::intern(to_string(k)));
    return interned;
  }();
  return names.at(static_cast<std::size_t>(kind));
}

trace::Name span_name(Algorithm algorithm) {
  static const auto names = [] {
    std::vector<trace::Name> interned;
    for (Algorithm a : all_algorithms) interned.push_back(trace::intern(to_string(a)));
    return interned;
  }();
  return names.at(static_cast<std::size_t>(algorithm));
}

}  // namespace

namespace detail {

asio::awaitable<void> run_message_algorithm(CollectiveOp& op, const CollectiveCall& call) {
  using enum CollectiveKind;
  switch (call.kind) {
    case all_reduce:
      switch (call.algorithm) {
        case Algorithm::hierarchical:
          co_await detail::hierarchical_all_reduce(op, call.input, call.output, call.reduce_op,
                                                   *call.hierarchy, *call.selection);
          co_return;
        default:
          co_await detail::message_all_reduce(op, call.input, call.output, call.reduce_op,
                                              call.algorithm);
          co_return;
      }
    case reduce_scatter:
      if (call.algorithm == Algorithm::hierarchical &&
          detail::hierarchical_exchange_fits(*call.hierarchy)) {
        co_await detail::hierarchical_reduce_scatter(op, call.input, call.output, call.reduce_op,
                                                     *call.hierarchy);
        co_return;
      }
      co_await detail::ring_reduce_scatter(op, call.input, call.output, call.reduce_op);
      co_return;
    case all_gather: {
      std::vector<std::size_t> equal;
      std::span<const std::size_t> counts = call.counts;
      if (!call.variable) {
        equal.assign(static_cast<std::size_t>(op.size()), call.input.count());
        counts = equal;
      }
      if (call.algorithm == Algorithm::hierarchical &&
          detail::hierarchical_exchange_fits(*call.hierarchy)) {
        co_await detail::hierarchical_all_gather(op, call.input, call.output, counts,
                                                 *call.hierarchy);
        co_return;
      }
      co_await detail::ring_all_gather(op, call.input, call.output, counts);
      co_return;
    }
    case broadcast:
      if (call.algorithm == Algorithm::ring) {
        co_await detail::ring_broadcast(op, call.output, call.root, *call.hierarchy);
        co_return;
      }
      co_await detail::binomial_tree_broadcast(op, call.output, call.root);
      co_return;
    case reduce:
      co_await detail::binomial_tree_reduce(op, call.input, call.output, call.reduce_op, call.root);
      co_return;
    case gather:
      co_await detail::linear_gather(op, call.input, call.output, call.root);
      co_return;
    case scatter:
      co_await detail::linear_scatter(op, call.input, call.output, call.root);
      co_return;
    case all_to_all: {
      std::vector<std::size_t> send_equal;
      std::vector<std::size_t> recv_equal;
      std::span<const std::size_t> send_counts = call.counts;
      std::span<const std::size_t> recv_counts = call.recv_counts;
      if (!call.variable) {
        const std::size_t block = call.input.count() / static_cast<std::size_t>(op.size());
        send_equal.assign(static_cast<std::size_t>(op.size()), block);
        recv_equal = send_equal;
        send_counts = send_equal;
        recv_counts = recv_equal;
      }
      co_await detail::pairwise_all_to_all(op, call.input, send_counts, call.output, recv_counts);
      co_return;
    }
    case barrier:
      co_await detail::dissemination_barrier(op);
      co_return;
  }
}

}  // namespace detail

namespace {

// Not a coroutine: each call starts its algorithm's frame directly, without one more frame
// around it; the small shared-memory calls (latency-bound: a frame is a visible part of an
// 8-byte all-reduce) run in that one frame.
asio::awaitable<void> run_algorithm(CollectiveOp& op, const CollectiveCall& call) {
  if (call.algorithm != Algorithm::shared_memory) return detail::run_message_algorithm(op, call);
  if (detail::fits_inline(call)) return detail::shared_memory_small(op, call);
  if (call.kind == CollectiveKind::all_reduce) return detail::shared_memory_all_reduce(op, call);
  return detail::shared_memory_collective(op, call);
}

}  // namespace

std::shared_ptr<Communicator> Communicator::world(transport::World& world, Options options) {
  std::vector<int> ranks(static_cast<std::size_t>(world.size()));
  std::iota(ranks.begin(), ranks.end(), 0);
  detail::CommunicatorIdentity name{.id = detail::kWorldCommunicatorId,
                                    .serial = detail::kWorldCommunicatorId,
                                    .ids = std::make_shared<detail::CommunicatorIds>()};
  return std::make_shared<Communicator>(Private{}, world, std::move(ranks), std::move(name),
                                        std::move(options));
}

Communicator::Communicator(Private, transport::World& world, std::vector<int> world_ranks,
                           detail::CommunicatorIdentity name, Options options)
    : state_(std::make_unique<State>(*this, world, std::move(world_ranks), std::move(name),
                                     std::move(options))) {}

Communicator::~Communicator() = default;

int Communicator::rank() const noexcept {
  return state_->rank();
}
int Communicator::size() const noexcept {
  return state_->size();
}
int Communicator::world_rank(int rank) const {
  return state_->world_rank(rank);
}
std::uint32_t Communicator::id() const noexcept {
  return state_->id_;
}
std::int64_t Communicator::serial() const noexcept {
  return state_->serial_;
}
Runtime& Communicator::runtime() noexcept {
  return state_->runtime_;
}
transport::World& Communicator::world() noexcept {
  return state_->world_;
}
const std::shared_ptr<NcclCommunicator>& Communicator::cuda_route() const noexcept {
  return state_->nccl_;
}
const HierarchyPlan& Communicator::hierarchy() const noexcept {
  return state_->hierarchy_;
}

Communicator::State::State(Communicator& self, transport::World& world,
                           std::vector<int> world_ranks, detail::CommunicatorIdentity name,
                           Options options)
    : world_(world),
      runtime_(world.runtime()),
      world_ranks_(std::move(world_ranks)),
      id_(name.id),
      serial_(name.serial),
      ids_(std::move(name.ids)),
      timeout_(options.timeout.value_or(default_timeout())),
      check_fingerprints_(
          options.check_fingerprints.value_or(detail::fingerprints_from_environment())),
      trace_steps_from_(config::kib_value("BRAID_TRACE_STEPS_KIB", 0, std::int64_t{1} << 30)),
      trace_sampling_(trace::SmallOpSampling::from_environment()),
      selection_(options.selection),
      send_sequence_(new std::atomic<std::uint64_t>[world_ranks_.size()]),
      recv_sequence_(new std::atomic<std::uint64_t>[world_ranks_.size()]),
      scratch_(std::make_unique<detail::ScratchPool>()),
      cuda_stream_(options.cuda_stream),
      track_(trace::track(fmt::format("communicator {}", name.id))),
      self_(self) {
  // Every member on this node (the whole job is): collectives may go through shared memory.
  if (world.launch().num_nodes == 1 && world_ranks_.size() > 1) {
    arena_ = std::make_unique<detail::SharedMemoryArena>(
        size(), detail::single_copy_from_environment(), detail::doorbells_from_environment());
  }
  if (selection_ == nullptr) {
    selection_ = std::shared_ptr<const SelectionTable>(&SelectionTable::from_environment(),
                                                       [](const SelectionTable*) {});
  }
  const auto me = std::find(world_ranks_.begin(), world_ranks_.end(), world.rank());
  BRAID_ENFORCE(me != world_ranks_.end(), "world rank {} is not a member of communicator {}",
                world.rank(), id_);
  rank_ = static_cast<int>(me - world_ranks_.begin());
  std::vector<int> nodes;
  for (int world_rank : world_ranks_) nodes.push_back(world.node_of(world_rank));
  hierarchy_ = HierarchyPlan::from_nodes(nodes, rank_);
  // On a reused id, above every sequence number its last users may have left a message
  // with (communicator_ids.hpp).
  next_sequence_.store(name.first_sequence, std::memory_order_relaxed);
  trace_sampling_.record_whole_until(name.first_sequence + trace_sampling_.every());
  for (std::size_t i = 0; i < world_ranks_.size(); ++i) {
    send_sequence_[i].store(name.first_sequence, std::memory_order_relaxed);
    recv_sequence_[i].store(name.first_sequence, std::memory_order_relaxed);
  }
  // `this` outlives the listener: the destructor removes it on the runtime thread, where
  // it runs.
  failure_listener_ =
      world.transport().add_peer_failure_listener([this](int peer, const std::string& why) {
        if (std::find(world_ranks_.begin(), world_ranks_.end(), peer) != world_ranks_.end()) {
          on_member_failed(peer, why);
        }
      });
  first_sequence_ = name.first_sequence;
  ended_listener_ =
      world.add_peer_ended_listener([this](int peer, const transport::IssuedWork& work) {
        const auto member = std::find(world_ranks_.begin(), world_ranks_.end(), peer);
        if (member != world_ranks_.end()) {
          on_member_ended(static_cast<int>(member - world_ranks_.begin()), work);
        }
      });
  work_source_ = world.add_issued_work_source([this] { return issued_work(); });
}

Communicator::State::~State() {
  world_.transport().remove_peer_failure_listener(failure_listener_);
  world_.remove_peer_ended_listener(ended_listener_);
  world_.retire_issued_work_source(work_source_);
  if (id_ == detail::kWorldCommunicatorId) return;
  // No operation is in flight (each holds the communicator): every sequence number this
  // rank will ever have used is below the counters.
  std::uint64_t unused = next_sequence_.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < world_ranks_.size(); ++i) {
    unused = std::max({unused, send_sequence_[i].load(std::memory_order_relaxed),
                       recv_sequence_[i].load(std::memory_order_relaxed)});
  }
  ids_->released({.serial = serial_, .id = id_, .members = size(), .unused_sequence = unused});
}

Algorithm Communicator::algorithm_for(CollectiveKind kind, std::size_t bytes) const {
  return state_->selection_->select(
      kind, bytes, size(),
      {.one_node = state_->arena_ != nullptr,
       .grouped_nodes = state_->hierarchy_.worth_it(),
       .even_nodes = state_->hierarchy_.worth_it() && state_->hierarchy_.uniform});
}

CollectiveCall Communicator::State::prepare(CollectiveKind kind) {
  CollectiveCall call;
  call.kind = kind;
  return call;
}

asio::awaitable<void> Communicator::State::submit(CollectiveCall call) {
  detail::check_call(call, site_of(self_), memory_rule_of(self_));
  const bool on_cuda =
      call.input.memory() == MemoryKind::cuda || call.output.memory() == MemoryKind::cuda;
  const Buffer& placed = call.input.memory() == MemoryKind::cuda ? call.input : call.output;
  if (on_cuda && routes_to_nccl(placed)) {
    // NCCL keeps its own order, the same on every rank: no sequence number is taken here.
    return start_on_nccl(call);
  }
  if (on_cuda) {
    // Staged: run() sees host copies, and picks their algorithms; none takes an arena turn.
    call.algorithm =
        selection_->select(call.kind, call.bytes, size(),
                           {.one_node = false,
                            .grouped_nodes = hierarchy_.worth_it(),
                            .even_nodes = hierarchy_.worth_it() && hierarchy_.uniform});
    call.hierarchy = &hierarchy_;
    call.selection = selection_.get();
    call.sequence = take_sequence();
    call.deadline = deadline_after(timeout_);
    std::shared_ptr<Communicator> self = self_.shared_from_this();
    return run_staged(std::move(self), std::move(call));
  }
  // all_to_all_v: each rank's sizes are its own, yet every rank must take the same path
  // (and the same arena turns), so the table is asked for the largest size: on one node,
  // single copy whatever the sizes (shared_memory_collectives.cpp); elsewhere pairwise.
  const bool sizes_differ = call.kind == CollectiveKind::all_to_all && call.variable;
  const std::size_t selected_bytes =
      sizes_differ ? std::numeric_limits<std::size_t>::max() - 1 : call.bytes;
  call.algorithm = self_.algorithm_for(call.kind, selected_bytes);
  // An empty call moves nothing (run() skips it), so it takes no turn in the arena; a
  // barrier moves nothing but is all turn.
  if (call.algorithm == Algorithm::shared_memory &&
      (selected_bytes != 0 || call.kind == CollectiveKind::barrier)) {
    call.arena = arena_.get();
    call.arena_ticket = arena_->take_ticket();
  }
  call.hierarchy = &hierarchy_;
  call.selection = selection_.get();
  call.sequence = take_sequence();
  call.deadline = kDefaultDeadline;  // the timeout runs from the op's first wait (CollectiveOp)
  std::shared_ptr<Communicator> self = self_.shared_from_this();
  return run(std::move(self), std::move(call));
}

asio::awaitable<void> Communicator::State::run_step(std::shared_ptr<Communicator> self,
                                                    CollectiveKind kind, Buffer input,
                                                    Buffer output, std::uint64_t sequence,
                                                    Deadline deadline) {
  BRAID_ENFORCE(kind == CollectiveKind::all_gather || kind == CollectiveKind::broadcast,
                "run_step runs all_gather and broadcast only");
  auto call = prepare(kind);
  call.input = input;
  call.output = output;
  call.root = 0;
  call.bytes = output.size_bytes();
  call.algorithm = kind == CollectiveKind::all_gather ? Algorithm::ring : Algorithm::binomial_tree;
  call.sequence = sequence;
  call.deadline = deadline;
  co_await run(std::move(self), std::move(call));
}

asio::awaitable<void> Communicator::State::run(std::shared_ptr<Communicator> self,
                                               CollectiveCall call) {
  CollectiveOp op(world_.transport(), world_ranks_, rank_, id_, call.sequence, call.deadline,
                  timeout_, *scratch_);
  // A small call left out of the trace leaves its steps and waits out too (they nest in
  // its span). The _v forms (each rank's bytes are its own) and the chunks of a staged
  // CUDA call (each a part of one call, under its sequence number) are never sampled: the
  // choice must be the same on every rank, and a chunk stands for no other calls.
  const std::uint32_t trace_weight = !trace::enabled() ? 0
                                     : (call.variable || call.staged)
                                         ? 1
                                         : trace_sampling_.weight(call.bytes, call.sequence, id_);
  op.set_track(track_, trace_weight != 0, trace_weight != 0 && call.bytes >= trace_steps_from_);
  // Built in place (a prvalue either way): moving a span copies its 104-byte record.
  trace::AsyncSpan span =
      trace_weight != 0
          ? trace::AsyncSpan(trace::Category::comm, span_name(call.kind), track_, call.bytes)
          : trace::AsyncSpan();
  // The communicator's id and the sequence number are the same on every member (rank 0 of
  // the split hands the id out; tags carry both): the summary matches a call's spans across
  // ranks by them to tell waiting for a late rank from the transfer (trace/summary.hpp).
  span.arg("comm", static_cast<std::int64_t>(id_));
  span.arg("seq", static_cast<std::int64_t>(call.sequence));
  if (trace_weight > 1) span.arg("sampled", trace_weight);
  span.text("algorithm", span_name(call.algorithm));
  // While in flight, a member's death aborts the op (see on_member_failed()).
  in_flight_.push_back(&op);
  std::exception_ptr failure;
  bool settle = false;
  bool algorithm_started = false;
  try {
    abort_if_unreachable(op);
    if (check_fingerprints_ && size() > 1) co_await detail::exchange_fingerprints(op, call, id_);
    const bool nothing_to_move = call.bytes == 0 && call.kind != CollectiveKind::barrier &&
                                 !(call.kind == CollectiveKind::all_to_all && call.variable);
    algorithm_started = true;
    if (!nothing_to_move) co_await run_algorithm(op, call);
  } catch (const Error& error) {
    std::string where = fmt::format("{}{}[{}]", to_string(call.kind), call.variable ? "_v" : "",
                                    to_string(call.algorithm));
    if (id_ != detail::kWorldCommunicatorId) where += fmt::format(" on communicator {}", id_);
    ErrorContext context{.rank = world_rank(rank_),
                         .peer = error.context().peer,
                         .operation = std::move(where),
                         .sequence = call.sequence};
    std::string detail = error.detail();
    if (error.code() == Errc::timeout && !check_fingerprints_) {
      // Without fingerprints, a partner that never made this call, or made it with other
      // sizes (and so chose another algorithm, which waits for other messages), shows up
      // only as this wait running out.
      detail +=
          "; every member must make the same calls in the same order with the same "
          "sizes (BRAID_DEBUG=detail checks each call and names a mismatch)";
    }
    Error failed(error.code(), std::move(detail), std::move(context));
    // Its own error, not a peer's failure: what its peers should hear if it leaves through it.
    if (error.code() != Errc::peer_failed) world_.note_error(failed.what());
    failure = std::make_exception_ptr(std::move(failed));
    settle = true;
  } catch (...) {
    failure = std::current_exception();
    settle = true;
  }
  if (settle) {
    std::string why = to_string(call.kind).data();
    co_await op.settle(std::move(why));
    // Its arena ticket was taken at the call: unserved, it would hold up every later
    // shared-memory operation.
    if (!algorithm_started && call.arena != nullptr) {
      try {
        co_await detail::pass_arena_turn(op, call);
      } catch (const Error&) {
        // The turn never came (an earlier operation still holds it, and fails on its own).
      }
    }
  }
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), &op));
  (void)self;  // keeps the communicator alive until the operation is done
  if (failure) std::rethrow_exception(failure);
}

void Communicator::set_computing(bool computing) noexcept {
  if (state_->arena_) state_->arena_->set_computing(computing);
}

void Communicator::State::on_member_failed(int world_peer, const std::string& why) {
  for (CollectiveOp* op : in_flight_) op->abort(world_peer, why);
}

namespace {

// Why `op` will never complete now that communicator rank `member` (world rank
// `world_peer`) left the job having issued `work` on the communicator `id` whose sequence
// numbers began at `first`; nullopt if it may still (the member issued it).
std::optional<std::string> never_issued(const CollectiveOp& op, int member, int world_peer,
                                        int my_world_rank, std::uint32_t id, std::uint64_t first,
                                        const transport::IssuedWork& work) {
  const auto mine = std::find_if(work.begin(), work.end(), [&](const auto& c) {
    return c.communicator == id && c.first_sequence == first;
  });
  // Not a member of this use of the id when it left: its ops here ended with it.
  if (mine == work.end()) return std::nullopt;
  const char* const hint = "did the ranks run different numbers of steps, or did one return early?";
  if (const auto& p2p = op.point_to_point()) {
    if (p2p->peer != member) return std::nullopt;
    const auto with_me = std::find_if(mine->point_to_point.begin(), mine->point_to_point.end(),
                                      [&](const auto& p) { return p.world_rank == my_world_rank; });
    std::uint64_t issued = first;
    if (with_me != mine->point_to_point.end()) {
      issued = p2p->sending ? with_me->received : with_me->sent;
    }
    if (op.sequence() < issued) return std::nullopt;
    if (p2p->sending) {
      return fmt::format(
          "rank {} ended its program (left the job) after posting {} receive(s) from this rank "
          "on this communicator; this send is message {} and will never be received ({})",
          world_peer, issued - first, op.sequence() - first + 1, hint);
    }
    return fmt::format(
        "rank {} ended its program (left the job) after sending {} message(s) to this rank on "
        "this communicator; this receive waits for message {}, which will never come ({})",
        world_peer, issued - first, op.sequence() - first + 1, hint);
  }
  if (op.sequence() < mine->issued) return std::nullopt;
  return fmt::format(
      "rank {} ended its program (left the job) after issuing {} operation(s) on this "
      "communicator; this is operation {}, which it will never join ({})",
      world_peer, mine->issued - first, op.sequence() - first + 1, hint);
}

}  // namespace

void Communicator::State::on_member_ended(int member, const transport::IssuedWork& work) {
  bool stuck_send = false;
  for (CollectiveOp* op : in_flight_) {
    if (auto why = never_issued(*op, member, world_rank(member), world_rank(rank_), id_,
                                first_sequence_, work)) {
      op->abort_with(world_rank(member), std::move(*why));
      stuck_send = stuck_send || (op->point_to_point() && op->point_to_point()->sending);
    }
  }
  if (!stuck_send) return;
  // An abort cancels receives; a send UCX cannot cancel (one past the eager size waits for
  // its receive). The member will never post it, so after the grace its other messages get
  // to arrive, the endpoint to it closes, which fails the send and frees its buffer.
  asio::co_spawn(
      runtime_.executor(),
      [](std::weak_ptr<Communicator> weak, int member) -> asio::awaitable<void> {
        asio::steady_timer grace(co_await asio::this_coro::executor);
        grace.expires_after(std::chrono::milliseconds(200));
        co_await grace.async_wait(asio::use_awaitable);
        const std::shared_ptr<Communicator> self = weak.lock();
        if (!self) co_return;
        const int peer = self->world_rank(member);
        const transport::IssuedWork* ended = self->state_->world_.peer_ended(peer);
        if (ended == nullptr) co_return;
        for (CollectiveOp* op : self->state_->in_flight_) {
          const auto& p2p = op->point_to_point();
          if (!p2p || !p2p->sending || p2p->peer != member) continue;
          if (!never_issued(*op, member, peer, self->world_rank(self->state_->rank_),
                            self->state_->id_, self->state_->first_sequence_, *ended)) {
            continue;
          }
          self->state_->world_.transport().fail_peer(
              peer,
              "it ended its program (left the job) without receiving a message this rank sent "
              "it, and the endpoint was closed to release the send buffer",
              transport::UcxWorker::PeerLoss::gone);
          break;
        }
      }(self_.weak_from_this(), member),
      asio::detached);
}

void Communicator::State::abort_if_unreachable(CollectiveOp& op) {
  // A member that died earlier fails the op at once: ranks that do not talk to it directly
  // would otherwise wait for partners that gave up. So does one that left without issuing it.
  // A point-to-point op waits on its peer alone (and the transport fails a dead one at once).
  const auto& p2p = op.point_to_point();
  for (int r = p2p ? p2p->peer : 0; r < (p2p ? p2p->peer + 1 : size()); ++r) {
    if (r == rank_) continue;
    const int peer = world_rank(r);
    if (auto why = world_.transport().peer_failure(peer)) op.abort(peer, *why);
    if (const transport::IssuedWork* work = world_.peer_ended(peer)) {
      if (auto why = never_issued(op, r, peer, world_rank(rank_), id_, first_sequence_, *work)) {
        op.abort_with(peer, std::move(*why));
      }
    }
  }
}

transport::CommunicatorWork Communicator::State::issued_work() const {
  transport::CommunicatorWork work{.communicator = id_,
                                   .first_sequence = first_sequence_,
                                   .issued = next_sequence_.load(std::memory_order_relaxed)};
  for (std::size_t i = 0; i < world_ranks_.size(); ++i) {
    const std::uint64_t sent = send_sequence_[i].load(std::memory_order_relaxed);
    const std::uint64_t received = recv_sequence_[i].load(std::memory_order_relaxed);
    if (sent == first_sequence_ && received == first_sequence_) continue;
    work.point_to_point.push_back(
        {.world_rank = world_ranks_[i], .sent = sent, .received = received});
  }
  return work;
}

}  // namespace braid::collectives
