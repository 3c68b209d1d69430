// The Communicator's entry points describe their call in a CollectiveCall; submit() checks
// it (call_checks.hpp), takes a sequence number and hands it to run(), which exchanges
// fingerprints (BRAID_DEBUG=detail), runs the selected algorithm and puts the operation's
// name on any error.
#include <algorithm>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include <braid/build_config.hpp>
#include <braid/collectives/communicator.hpp>
#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/trace/span.hpp>
#include <braid/transport/tag.hpp>
#include <braid/transport/world.hpp>

#include "algorithms/algorithms.hpp"
#include "call_checks.hpp"
#include "collective_call.hpp"
#include "collective_op.hpp"
#include "communicator_ids.hpp"
#include "scratch_pool.hpp"
#include "shared_memory_arena.hpp"
#include "staging.hpp"
#if BRAID_WITH_CUDA
#include <braid/collectives/nccl_communicator.hpp>

#include "cuda_copy_engine.hpp"
#endif

namespace braid::collectives {

using detail::CollectiveCall;
using detail::CollectiveOp;
using detail::Message;

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

bool fingerprints_from_environment() {
  const std::string value = config::string_value("BRAID_DEBUG");
  if (value == "detail") return true;
  if (value == "off" || value.empty()) return false;
  throw Error(Errc::invalid_environment,
              fmt::format("BRAID_DEBUG='{}': expected off or detail", value),
              {.operation = "collectives"});
}

std::uint64_t hash_counts(std::span<const std::size_t> counts) {
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (std::size_t count : counts) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (static_cast<std::uint64_t>(count) >> (8 * byte)) & 0xff;
      hash *= 1099511628211ull;
    }
  }
  return hash;
}

bool is_reduction(CollectiveKind kind) {
  return kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter ||
         kind == CollectiveKind::reduce;
}

asio::awaitable<void> exchange_fingerprints(CollectiveOp& op, const CollectiveCall& call,
                                            std::uint32_t communicator) {
  const detail::Fingerprint mine = detail::fingerprint_of(call);
  std::vector<detail::Fingerprint> theirs(static_cast<std::size_t>(op.size()));
  std::vector<Message> messages;
  for (int peer = 0; peer < op.size(); ++peer) {
    if (peer == op.rank()) continue;
    const Buffer into(&theirs[static_cast<std::size_t>(peer)], sizeof(detail::Fingerprint),
                      DType::u8);
    messages.push_back(op.recv_reserved(peer, into, detail::kFingerprintStep, true));
  }
  detail::Fingerprint sent = mine;
  for (int peer = 0; peer < op.size(); ++peer) {
    if (peer == op.rank()) continue;
    const Buffer from(&sent, sizeof(detail::Fingerprint), DType::u8);
    messages.push_back(op.send_reserved(peer, from, detail::kFingerprintStep));
  }
  co_await op.wait_all(messages);
  for (int peer = 0; peer < op.size(); ++peer) {
    if (peer == op.rank()) continue;
    const detail::Fingerprint& other = theirs[static_cast<std::size_t>(peer)];
    if (other == mine) continue;
    throw Error(Errc::desync,
                fmt::format("at sequence {} of communicator {}, this rank called {} and rank {} "
                            "called {}",
                            call.sequence, communicator, detail::describe(mine),
                            op.world_rank(peer), detail::describe(other)),
                {.rank = op.world_rank(op.rank()), .peer = op.world_rank(peer)});
  }
}

}  // namespace

namespace detail {

// GCC 12 misreports asio's coroutine frame allocator as a mismatched new/delete once this
// switch grows past a size it inlines differently (GCC bug 109224); the frame is allocated
// and freed by asio's own matching operators.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

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
      co_await detail::ring_reduce_scatter(op, call.input, call.output, call.reduce_op);
      co_return;
    case all_gather: {
      std::vector<std::size_t> equal;
      std::span<const std::size_t> counts = call.counts;
      if (!call.variable) {
        equal.assign(static_cast<std::size_t>(op.size()), call.input.count());
        counts = equal;
      }
      co_await detail::ring_all_gather(op, call.input, call.output, counts);
      co_return;
    }
    case broadcast:
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
#pragma GCC diagnostic pop

}  // namespace detail

namespace {

// Not a coroutine: each call starts its algorithm's frame directly, without one more frame
// around it; the small shared-memory calls (latency-bound: an 8-byte all-reduce takes a
// third of a microsecond) run in that one frame.
asio::awaitable<void> run_algorithm(CollectiveOp& op, const CollectiveCall& call) {
  if (call.algorithm != Algorithm::shared_memory) return detail::run_message_algorithm(op, call);
  if (detail::fits_inline(call)) return detail::shared_memory_small(op, call);
  if (call.kind == CollectiveKind::all_reduce) return detail::shared_memory_all_reduce(op, call);
  return detail::shared_memory_collective(op, call);
}

}  // namespace

namespace detail {

Fingerprint fingerprint_of(const CollectiveCall& call) {
  Fingerprint f;
  f.kind = static_cast<std::uint8_t>(call.kind);
  f.variable = call.variable ? 1 : 0;
  f.staged = call.staged ? 1 : 0;
  f.sequence = call.sequence;
  if (call.kind == CollectiveKind::barrier) return f;
  // The buffer every rank passes (non-roots' outputs of reduce and gather, and their
  // inputs of scatter, are empty).
  const bool output_typed =
      call.kind == CollectiveKind::scatter || call.kind == CollectiveKind::broadcast;
  const Buffer& typed = output_typed ? call.output : call.input;
  f.dtype = static_cast<std::uint8_t>(typed.dtype());
  f.reduce_op = is_reduction(call.kind) ? static_cast<std::uint8_t>(call.reduce_op) : 0xff;
  f.root = is_rooted(call.kind) ? call.root : -1;
  switch (call.kind) {
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::scatter:
      f.count = call.output.count();
      break;
    case CollectiveKind::broadcast:
      f.count = call.output.count();
      break;
    default:
      f.count = call.variable ? 0 : call.input.count();
  }
  if (call.kind == CollectiveKind::all_gather && call.variable)
    f.counts_hash = hash_counts(call.counts);
  return f;
}

std::string describe(const Fingerprint& f) {
  const auto kind = static_cast<CollectiveKind>(f.kind);
  std::string text = fmt::format("{}{}(", to_string(kind), f.variable ? "_v" : "");
  if (kind == CollectiveKind::barrier) return text + ")";
  if (f.variable) {
    text += kind == CollectiveKind::all_gather ? fmt::format("counts #{:016x}", f.counts_hash)
                                               : std::string("variable counts");
  } else {
    text += fmt::format("count {}", f.count);
  }
  text += fmt::format(", {}", to_string(static_cast<DType>(f.dtype)));
  if (f.reduce_op != 0xff)
    text += fmt::format(", {}", to_string(static_cast<ReduceOp>(f.reduce_op)));
  if (f.root >= 0) text += fmt::format(", root {}", f.root);
  if (f.staged != 0) text += ", CUDA memory staged through the host";
  return text + ")";
}

}  // namespace detail

std::shared_ptr<Communicator> Communicator::world(transport::World& world, Options options) {
  std::vector<int> ranks(static_cast<std::size_t>(world.size()));
  std::iota(ranks.begin(), ranks.end(), 0);
  Name name{.id = detail::kWorldCommunicatorId,
            .serial = detail::kWorldCommunicatorId,
            .ids = std::make_shared<detail::CommunicatorIds>()};
  return std::make_shared<Communicator>(Private{}, world, std::move(ranks), std::move(name),
                                        std::move(options));
}

Communicator::Communicator(Private, transport::World& world, std::vector<int> world_ranks,
                           Name name, Options options)
    : world_(world),
      runtime_(world.runtime()),
      world_ranks_(std::move(world_ranks)),
      id_(name.id),
      serial_(name.serial),
      ids_(std::move(name.ids)),
      timeout_(options.timeout.value_or(default_timeout())),
      check_fingerprints_(options.check_fingerprints.value_or(fingerprints_from_environment())),
      trace_steps_from_(config::kib_value("BRAID_TRACE_STEPS_KIB", 0, std::int64_t{1} << 30)),
      trace_sampling_(trace::SmallOpSampling::from_environment()),
      selection_(options.selection),
      send_sequence_(new std::atomic<std::uint64_t>[world_ranks_.size()]),
      recv_sequence_(new std::atomic<std::uint64_t>[world_ranks_.size()]),
      scratch_(std::make_unique<detail::ScratchPool>()),
      staging_engine_(std::move(options.staging_engine)),
      cuda_stream_(options.cuda_stream),
      track_(trace::track(fmt::format("communicator {}", name.id))) {
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
}

Communicator::~Communicator() {
  world_.transport().remove_peer_failure_listener(failure_listener_);
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
  return selection_->select(
      kind, bytes, size(), {.one_node = arena_ != nullptr, .grouped_nodes = hierarchy_.worth_it()});
}

CollectiveCall Communicator::prepare(CollectiveKind kind) {
  CollectiveCall call;
  call.kind = kind;
  return call;
}

asio::awaitable<void> Communicator::run(std::shared_ptr<Communicator> self, CollectiveCall call) {
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
    // A member that died earlier fails the op at once: ranks that do not talk to it
    // directly would otherwise wait for partners that gave up.
    for (int r = 0; r < size(); ++r) {
      if (auto why = world_.transport().peer_failure(world_rank(r)); why && r != rank_) {
        op.abort(world_rank(r), *why);
      }
    }
    if (check_fingerprints_ && size() > 1) co_await exchange_fingerprints(op, call, id_);
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
    failure = std::make_exception_ptr(Error(error.code(), std::move(detail), std::move(context)));
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

void Communicator::route_cuda_to(std::shared_ptr<NcclCommunicator> nccl) {
#if BRAID_WITH_CUDA
  BRAID_ENFORCE(nccl == nullptr || nccl->size() == size(),
                "an NCCL communicator of {} ranks cannot carry a communicator of {}",
                nccl == nullptr ? 0 : nccl->size(), size());
#endif
  nccl_ = std::move(nccl);
}

namespace {
// Keeps the NCCL communicator alive from the call until the operation is done.
template <class T>
asio::awaitable<T> holding(std::shared_ptr<NcclCommunicator> nccl, asio::awaitable<T> operation) {
  (void)nccl;
  co_return co_await std::move(operation);
}
}  // namespace

bool Communicator::routes_to_nccl(const Buffer& buffer) const {
#if BRAID_WITH_CUDA
  return nccl_ != nullptr && buffer.memory() == MemoryKind::cuda &&
         buffer.device() == nccl_->device();
#else
  (void)buffer;
  return false;
#endif
}

asio::awaitable<void> Communicator::start_on_nccl(const CollectiveCall& c) {
#if BRAID_WITH_CUDA
  // The NCCL entry points take their place in NCCL's issue order now, at the call, as this
  // communicator's own calls do.
  NcclCommunicator& nccl = *nccl_;
  asio::awaitable<void> started = [&]() -> asio::awaitable<void> {
    switch (c.kind) {
      case CollectiveKind::all_reduce:
        return nccl.all_reduce(c.input, c.output, c.reduce_op);
      case CollectiveKind::reduce_scatter:
        return nccl.reduce_scatter(c.input, c.output, c.reduce_op);
      case CollectiveKind::reduce:
        return nccl.reduce(c.input, c.output, c.reduce_op, c.root);
      case CollectiveKind::all_gather:
        return c.variable ? nccl.all_gather_v(c.input, c.output, c.counts)
                          : nccl.all_gather(c.input, c.output);
      case CollectiveKind::broadcast:
        return nccl.broadcast(c.output, c.root);
      case CollectiveKind::gather:
        return nccl.gather(c.input, c.output, c.root);
      case CollectiveKind::scatter:
        return nccl.scatter(c.input, c.output, c.root);
      case CollectiveKind::all_to_all:
        return c.variable ? nccl.all_to_all_v(c.input, c.counts, c.output, c.recv_counts)
                          : nccl.all_to_all(c.input, c.output);
      case CollectiveKind::barrier:
        return nccl.barrier();
    }
    return nccl.barrier();
  }();
  return holding(nccl_, std::move(started));
#else
  (void)c;
  BRAID_ENFORCE(false, "an NCCL route in a build without CUDA");
  return barrier();
#endif
}

void Communicator::set_computing(bool computing) noexcept {
  if (arena_) arena_->set_computing(computing);
}

bool Communicator::accepts_cuda_buffers() const noexcept {
  return BRAID_WITH_CUDA != 0 || static_cast<bool>(staging_engine_);
}

detail::StagingResources& Communicator::staging_for(int device) {
  for (auto& [staged_device, resources] : staging_) {
    if (staged_device == device) return *resources;
  }
  auto resources = std::make_unique<detail::StagingResources>();
  if (staging_engine_) {
    resources->engine = staging_engine_(device);
  } else {
#if BRAID_WITH_CUDA
    resources->engine =
        std::make_unique<detail::CudaCopyEngine>(device, static_cast<cudaStream_t>(cuda_stream_));
#endif
  }
  BRAID_ENFORCE(resources->engine != nullptr, "no copy engine for CUDA device {}", device);
  resources->pool = std::make_unique<detail::StagingPool>(*resources->engine);
  staging_.emplace_back(device, std::move(resources));
  return *staging_.back().second;
}

asio::awaitable<void> Communicator::run_staged(std::shared_ptr<Communicator> self,
                                               CollectiveCall call) {
  // Locals, not the parameters, are what the lambdas below capture (GCC 12 may bind a
  // coroutine lambda's reference capture of a parameter to the caller's copy).
  const std::shared_ptr<Communicator> owner = self;
  const CollectiveCall* const original = &call;
  const Buffer& on_device =
      original->input.memory() == MemoryKind::cuda ? original->input : original->output;
  detail::StagingResources& staging = staging_for(on_device.device());
  const MemberPlacement placement{.one_node = false, .grouped_nodes = hierarchy_.worth_it()};
  // The same call (kind, sequence, root, counts) on host views of its buffers.
  const auto on_host = [this, original, placement](Buffer input, Buffer output, std::size_t bytes) {
    CollectiveCall host_call = *original;
    host_call.input = input;
    host_call.output = output;
    host_call.bytes = bytes;
    host_call.staged = true;
    host_call.algorithm = selection_->select(original->kind, bytes, size(), placement);
    return host_call;
  };
  const bool root = rank_ == original->root;
  switch (call.kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::broadcast:
    case CollectiveKind::reduce: {
      // Chunk k of the result needs chunk k of every input only: pipeline the chunks. They
      // run one after another under the call's sequence number; a chunk's messages match
      // their receives in order (tag.hpp), so chunks never mix.
      const bool reduce_elsewhere = call.kind == CollectiveKind::reduce && !root;
      const detail::ElementwiseStaging layout{
          .input = call.input,
          .output = reduce_elsewhere ? call.input : call.output,
          .copy_in = call.kind != CollectiveKind::broadcast || root,
          .copy_out = !reduce_elsewhere,
          .chunk_bytes = detail::staging_chunk_bytes()};
      detail::ChunkRunner run_chunk = [this, &owner, &on_host,
                                       reduce_elsewhere](Buffer chunk) -> asio::awaitable<void> {
        co_await run(owner,
                     on_host(chunk, reduce_elsewhere ? Buffer{} : chunk, chunk.size_bytes()));
      };
      co_await detail::run_elementwise_staged(*staging.engine, *staging.pool, layout,
                                              std::move(run_chunk), call.deadline);
      co_return;
    }
    default: {
      detail::WholeRunner run_whole = [this, &owner, &on_host, original](
                                          Buffer input,
                                          Buffer output) -> asio::awaitable<std::size_t> {
        co_await run(owner, on_host(input, output, original->bytes));
        co_return output.size_bytes();
      };
      co_await detail::run_whole_staged(*staging.engine, *staging.pool, call.input, call.output,
                                        std::move(run_whole), call.deadline);
      co_return;
    }
  }
}

void Communicator::on_member_failed(int world_peer, const std::string& why) {
  for (CollectiveOp* op : in_flight_) op->abort(world_peer, why);
}

// ---------------------------------------------------------------- entry points

namespace {

Deadline deadline_for(Clock::duration timeout) {
  return deadline_after(timeout);
}

// The calls' checks (call_checks.hpp): the error names the world rank; buffers are host
// memory, or CUDA memory where the communicator can stage it.
detail::CallSite site_of(const Communicator& comm) {
  return {.rank = comm.rank(),
          .size = comm.size(),
          .world_rank = comm.size() > 0 ? comm.world_rank(comm.rank()) : -1};
}

detail::MemoryRule memory_rule_of(const Communicator& comm) {
  return detail::host_or_staged_memory(comm.accepts_cuda_buffers());
}

}  // namespace

asio::awaitable<void> Communicator::submit(CollectiveCall call) {
  detail::check_call(call, site_of(*this), memory_rule_of(*this));
  const bool on_cuda =
      call.input.memory() == MemoryKind::cuda || call.output.memory() == MemoryKind::cuda;
  const Buffer& placed = call.input.memory() == MemoryKind::cuda ? call.input : call.output;
  if (on_cuda && routes_to_nccl(placed)) {
    // NCCL keeps its own order, the same on every rank: no sequence number is taken here.
    return start_on_nccl(call);
  }
  if (on_cuda) {
    // Staged: run() sees host copies, and picks their algorithms; none takes an arena turn.
    call.algorithm = selection_->select(
        call.kind, call.bytes, size(), {.one_node = false, .grouped_nodes = hierarchy_.worth_it()});
    call.hierarchy = &hierarchy_;
    call.selection = selection_.get();
    call.sequence = take_sequence();
    call.deadline = deadline_for(timeout_);
    std::shared_ptr<Communicator> self = shared_from_this();
    return run_staged(std::move(self), std::move(call));
  }
  // all_to_all_v: each rank's sizes are its own, yet every rank must take the same path
  // (and the same arena turns), so the table is asked for the largest size: on one node,
  // single copy whatever the sizes (shared_memory_collectives.cpp); elsewhere pairwise.
  const bool sizes_differ = call.kind == CollectiveKind::all_to_all && call.variable;
  const std::size_t selected_bytes =
      sizes_differ ? std::numeric_limits<std::size_t>::max() - 1 : call.bytes;
  call.algorithm = algorithm_for(call.kind, selected_bytes);
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
  std::shared_ptr<Communicator> self = shared_from_this();
  return run(std::move(self), std::move(call));
}

// Each entry point describes its call; submit() checks it. A rooted call's other ranks
// pass no root buffer on (they may pass anything there).

asio::awaitable<void> Communicator::all_reduce(Buffer input, Buffer output, ReduceOp op) {
  return submit({.kind = CollectiveKind::all_reduce,
                 .input = input,
                 .output = output,
                 .reduce_op = op,
                 .bytes = input.size_bytes()});
}

asio::awaitable<void> Communicator::all_reduce(Buffer data, ReduceOp op) {
  return all_reduce(data, data, op);
}

asio::awaitable<void> Communicator::reduce_scatter(Buffer input, Buffer output, ReduceOp op) {
  return submit({.kind = CollectiveKind::reduce_scatter,
                 .input = input,
                 .output = output,
                 .reduce_op = op,
                 .bytes = input.size_bytes()});
}

asio::awaitable<void> Communicator::reduce_scatter(Buffer data, ReduceOp op) {
  return reduce_scatter(
      data, detail::rank_block(CollectiveKind::reduce_scatter, data, site_of(*this)), op);
}

asio::awaitable<void> Communicator::reduce(Buffer input, Buffer output, ReduceOp op, int root) {
  return submit({.kind = CollectiveKind::reduce,
                 .input = input,
                 .output = rank_ == root ? output : Buffer{},
                 .reduce_op = op,
                 .root = root,
                 .bytes = input.size_bytes()});
}

asio::awaitable<void> Communicator::reduce(Buffer data, ReduceOp op, int root) {
  return reduce(data, data, op, root);
}

asio::awaitable<void> Communicator::all_gather(Buffer input, Buffer output) {
  return submit({.kind = CollectiveKind::all_gather,
                 .input = input,
                 .output = output,
                 .bytes = output.size_bytes()});
}

asio::awaitable<void> Communicator::all_gather(Buffer data) {
  return all_gather(detail::rank_block(CollectiveKind::all_gather, data, site_of(*this)), data);
}

asio::awaitable<void> Communicator::all_gather_v(Buffer input, Buffer output,
                                                 std::span<const std::size_t> counts) {
  return submit({.kind = CollectiveKind::all_gather,
                 .input = input,
                 .output = output,
                 .counts = counts,
                 .variable = true,
                 .bytes = output.size_bytes()});
}

asio::awaitable<void> Communicator::broadcast(Buffer data, int root) {
  return submit({.kind = CollectiveKind::broadcast,
                 .input = data,
                 .output = data,
                 .root = root,
                 .bytes = data.size_bytes()});
}

asio::awaitable<void> Communicator::gather(Buffer input, Buffer output, int root) {
  return submit({.kind = CollectiveKind::gather,
                 .input = input,
                 .output = rank_ == root ? output : Buffer{},
                 .root = root,
                 .bytes = input.size_bytes() * static_cast<std::size_t>(size())});
}

asio::awaitable<void> Communicator::scatter(Buffer input, Buffer output, int root) {
  return submit({.kind = CollectiveKind::scatter,
                 .input = rank_ == root ? input : Buffer{},
                 .output = output,
                 .root = root,
                 .bytes = output.size_bytes() * static_cast<std::size_t>(size())});
}

asio::awaitable<void> Communicator::all_to_all(Buffer input, Buffer output) {
  return submit({.kind = CollectiveKind::all_to_all,
                 .input = input,
                 .output = output,
                 .bytes = input.size_bytes()});
}

asio::awaitable<void> Communicator::all_to_all(Buffer data) {
  return all_to_all(data, data);
}

asio::awaitable<void> Communicator::all_to_all_v(Buffer input,
                                                 std::span<const std::size_t> send_counts,
                                                 Buffer output,
                                                 std::span<const std::size_t> recv_counts) {
  return submit({.kind = CollectiveKind::all_to_all,
                 .input = input,
                 .output = output,
                 .counts = send_counts,
                 .recv_counts = recv_counts,
                 .variable = true,
                 .bytes = input.size_bytes()});
}

asio::awaitable<void> Communicator::barrier() {
  return submit({.kind = CollectiveKind::barrier});
}

// ---------------------------------------------------------------- point to point

namespace {

asio::awaitable<std::size_t> run_point_to_point(std::shared_ptr<Communicator> self,
                                                std::unique_ptr<CollectiveOp> op, bool sending,
                                                Buffer data, int peer) {
  std::exception_ptr failure;
  std::size_t bytes = 0;
  try {
    Message message = sending ? op->send_reserved(peer, data, detail::kPointToPointStep)
                              : op->recv_reserved(peer, data, detail::kPointToPointStep, false);
    bytes = co_await op->wait(message);
  } catch (const Error& error) {
    ErrorContext context{.rank = op->world_rank(op->rank()),
                         .peer = op->world_rank(peer),
                         .operation = sending ? "send" : "recv",
                         .sequence = op->sequence()};
    failure = std::make_exception_ptr(Error(error.code(), error.detail(), std::move(context)));
  }
  if (failure) std::rethrow_exception(failure);
  const std::size_t element = dtype_size(data.dtype());
  if (!sending && bytes % element != 0) {
    throw Error(Errc::size_mismatch,
                fmt::format("rank {} sent {} bytes, not a whole number of {} elements",
                            op->world_rank(peer), bytes, to_string(data.dtype())),
                {.rank = op->world_rank(op->rank()),
                 .peer = op->world_rank(peer),
                 .operation = "recv",
                 .sequence = op->sequence()});
  }
  (void)self;
  co_return bytes / element;
}

asio::awaitable<void> discard_count(asio::awaitable<std::size_t> operation) {
  co_await std::move(operation);
}

}  // namespace

asio::awaitable<std::size_t> Communicator::staged_point_to_point(std::shared_ptr<Communicator> self,
                                                                 std::unique_ptr<CollectiveOp> op,
                                                                 bool sending, Buffer data,
                                                                 int peer) {
  // Locals for the lambda to capture, not the parameters (see run_staged).
  std::shared_ptr<Communicator> owner = self;
  std::unique_ptr<CollectiveOp> owned_op = std::move(op);
  const bool is_send = sending;
  const Buffer buffer = data;
  const int partner = peer;
  detail::StagingResources& staging = staging_for(buffer.device());
  const Deadline deadline = owned_op->deadline();
  const Buffer nothing(nullptr, 0, buffer.dtype());
  std::size_t elements = 0;
  detail::WholeRunner transfer = [&owner, &owned_op, &elements, is_send, buffer, partner](
                                     Buffer host_in,
                                     Buffer host_out) -> asio::awaitable<std::size_t> {
    elements = co_await run_point_to_point(owner, std::move(owned_op), is_send,
                                           is_send ? host_in : host_out, partner);
    co_return elements* dtype_size(buffer.dtype());
  };
  co_await detail::run_whole_staged(*staging.engine, *staging.pool, is_send ? buffer : nothing,
                                    is_send ? nothing : buffer, std::move(transfer), deadline);
  co_return elements;
}

asio::awaitable<void> Communicator::send(Buffer data, int peer) {
  detail::check_point_to_point("send", data, peer, site_of(*this), memory_rule_of(*this));
  const std::uint64_t sequence = send_sequence_[static_cast<std::size_t>(peer)].fetch_add(1);
  auto op = std::make_unique<CollectiveOp>(world_.transport(), world_ranks_, rank_, id_, sequence,
                                           deadline_for(timeout_), timeout_, *scratch_);
  std::shared_ptr<Communicator> self = shared_from_this();
#if BRAID_WITH_CUDA
  if (routes_to_nccl(data)) return holding(nccl_, nccl_->send(data, peer));
#endif
  if (data.memory() == MemoryKind::cuda && !world_.transport().moves_cuda_memory()) {
    return discard_count(staged_point_to_point(std::move(self), std::move(op), true, data, peer));
  }
  asio::awaitable<std::size_t> sending =
      run_point_to_point(std::move(self), std::move(op), true, data, peer);
  return discard_count(std::move(sending));
}

asio::awaitable<std::size_t> Communicator::recv(Buffer data, int peer) {
  detail::check_point_to_point("recv", data, peer, site_of(*this), memory_rule_of(*this));
  const std::uint64_t sequence = recv_sequence_[static_cast<std::size_t>(peer)].fetch_add(1);
  auto op = std::make_unique<CollectiveOp>(world_.transport(), world_ranks_, rank_, id_, sequence,
                                           deadline_for(timeout_), timeout_, *scratch_);
  std::shared_ptr<Communicator> self = shared_from_this();
#if BRAID_WITH_CUDA
  if (routes_to_nccl(data)) return holding(nccl_, nccl_->recv(data, peer));
#endif
  if (data.memory() == MemoryKind::cuda && !world_.transport().moves_cuda_memory()) {
    return staged_point_to_point(std::move(self), std::move(op), false, data, peer);
  }
  return run_point_to_point(std::move(self), std::move(op), false, data, peer);
}

// ---------------------------------------------------------------- split

asio::awaitable<std::shared_ptr<Communicator>> Communicator::split(int color, int key) {
  // Two collectives on this communicator (an all-gather of (color, key) and a broadcast
  // of the new ids), numbered now so that split keeps its place in the order.
  const std::uint64_t sequence = next_sequence_.fetch_add(2);
  std::shared_ptr<Communicator> self = shared_from_this();
  return run_split(std::move(self), sequence, color, key, deadline_for(timeout_));
}

asio::awaitable<void> Communicator::run_step(std::shared_ptr<Communicator> self,
                                             CollectiveKind kind, Buffer input, Buffer output,
                                             std::uint64_t sequence, Deadline deadline) {
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

asio::awaitable<std::shared_ptr<Communicator>> Communicator::run_split(
    std::shared_ptr<Communicator> self, std::uint64_t sequence, int color, int key,
    Deadline deadline) {
  // Ids that communicators destroyed here gave back: counted before the all-gather, so
  // rank 0 below sees those of every rank taking part.
  co_await detail::publish_releases(world_.store(), ids_->take_released(), world_.rank());
  const auto world_size = static_cast<std::size_t>(size());
  std::vector<std::int32_t> mine{color, key};
  std::vector<std::int32_t> everyone(2 * world_size);
  co_await run_step(self, CollectiveKind::all_gather, Buffer(mine), Buffer(everyone), sequence,
                    deadline);
  std::vector<int> colors;
  for (std::size_t r = 0; r < world_size; ++r) {
    if (everyone[2 * r] >= 0) colors.push_back(everyone[2 * r]);
  }
  std::sort(colors.begin(), colors.end());
  colors.erase(std::unique(colors.begin(), colors.end()), colors.end());

  // Per color (serial, id, first sequence), and one word so that it is never empty.
  std::vector<std::int64_t> names(3 * colors.size() + 1);
  if (rank_ == 0) {
    const std::vector<detail::CommunicatorName> made =
        co_await detail::allocate_names(world_.store(), colors.size(), world_.rank());
    for (std::size_t i = 0; i < made.size(); ++i) {
      names[3 * i] = made[i].serial;
      names[3 * i + 1] = made[i].id;
      names[3 * i + 2] = static_cast<std::int64_t>(made[i].first_sequence);
    }
  }
  co_await run_step(self, CollectiveKind::broadcast, Buffer(names), Buffer(names), sequence + 1,
                    deadline);
  if (color < 0) co_return nullptr;

  const auto color_index = static_cast<std::size_t>(
      std::lower_bound(colors.begin(), colors.end(), color) - colors.begin());
  const std::int64_t id = names[3 * color_index + 1];
  if (id >= static_cast<std::int64_t>(transport::max_communicators)) {
    throw Error(Errc::invalid_argument,
                fmt::format("all {} ids the message tag has for split communicators are "
                            "taken (an id comes back once every member has destroyed its "
                            "communicator and split again)",
                            transport::max_communicators - detail::kFirstSplitId),
                {.rank = world_rank(rank_), .operation = "split"});
  }
  std::vector<std::pair<int, int>> members;  // (key, rank here)
  for (std::size_t r = 0; r < world_size; ++r) {
    if (everyone[2 * r] == color) members.emplace_back(everyone[2 * r + 1], static_cast<int>(r));
  }
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (const auto& [member_key, r] : members) ranks.push_back(world_rank(r));
  Options options{.timeout = timeout_,
                  .check_fingerprints = check_fingerprints_,
                  .selection = selection_,
                  .cuda_stream = cuda_stream_,
                  .staging_engine = staging_engine_};
  Name name{.id = static_cast<std::uint32_t>(id),
            .serial = names[3 * color_index],
            .first_sequence = static_cast<std::uint64_t>(names[3 * color_index + 2]),
            .ids = ids_};
  co_return std::make_shared<Communicator>(Private{}, world_, std::move(ranks), std::move(name),
                                           std::move(options));
}

}  // namespace braid::collectives
