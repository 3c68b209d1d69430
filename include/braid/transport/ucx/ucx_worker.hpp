// UcxWorker: one UCX context and worker on a Runtime, endpoints to every rank, and tagged
// point-to-point send/recv as awaitables.
//
//   UcxWorker worker(runtime);
//   Bytes mine = worker.address();
//   worker.connect(all_gather(mine), my_rank);      // addresses_by_rank, from the store
//   co_await worker.send(1, Buffer(data), {.communicator = 0, .sequence = 7}, deadline);
//   std::size_t n = co_await worker.recv(1, Buffer(out), {.sequence = 7}, deadline);
//
// Threading: UCX runs in single-thread mode on the runtime's progress thread. The
// constructor, connect() and the destructor may be called from any thread (they hop to
// the runtime thread); send() and recv() must be awaited by a coroutine running on the
// runtime's thread (spawn it with runtime.spawn()). They resume on that coroutine's
// executor, never inside UCX's progress call.
//
// Progress is event driven: the worker sleeps on UCX's event fd inside the io_context,
// and after any activity keeps polling for BRAID_UCX_SPIN_US (see Options::spin) before
// sleeping again, which keeps small-message latency near that of busy polling.
//
// Errors (braid::Error, context: rank, peer, "send"/"recv", tag sequence):
//   Errc::timeout        the deadline passed (the buffer is released before this is thrown)
//   Errc::peer_failed    the peer died, its connection broke, or a send to it timed out
//                        (see send()); every later operation with that peer fails at once
//   Errc::size_mismatch  the incoming message is larger than the receive buffer
//   Errc::invalid_argument  a CUDA buffer, a peer outside the world, a communicator id
//                        >= max_communicators
//   Errc::closed         the worker was destroyed while the operation waited
//   ucx_category() codes for UCX failures that are none of the above.
#pragma once

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
#include <braid/transport/store/store.hpp>
#include <braid/transport/ucx/tag.hpp>

namespace braid::transport {

namespace detail {
class UcxWorkerImpl;
struct UcxOp;
}  // namespace detail

// A send or receive started with UcxWorker::start_send / start_recv, not yet awaited.
// Several can be in flight from one coroutine (a ring step sends right while it receives
// from the left; a pipeline keeps chunks in flight while it reduces others) without a
// coroutine per message. Move-only; used and destroyed on the runtime's thread. Dropping
// one unawaited lets UCX finish it in the background and discards the result, but the
// buffer stays in use until then, so algorithms await every transfer they start.
class Transfer {
 public:
  Transfer() = default;
  Transfer(Transfer&& other) noexcept;
  Transfer& operator=(Transfer&& other) noexcept;
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
  ~Transfer();

  // True once started and not yet awaited.
  bool valid() const noexcept { return started_; }
  // True when UCX has finished with the buffer (wait() would not suspend).
  bool ready() const noexcept;

 private:
  friend class UcxWorker;
  void reset() noexcept;

  // Null when UCX finished the operation inside the start call (`length` then holds
  // the result); else the pending op, kept alive with the worker state it lives in.
  std::shared_ptr<detail::UcxWorkerImpl> impl_;
  detail::UcxOp* op_ = nullptr;
  std::size_t length_ = 0;
  bool started_ = false;
};

class UcxWorker {
 public:
  struct Options {
    // How long to keep polling after the last activity before sleeping on the event fd.
    // nullopt: BRAID_UCX_SPIN_US. Longer lowers latency for sparse traffic and burns a
    // core for that long after every burst; 0 sleeps at once (an epoll round trip, a few
    // microseconds, per message).
    std::optional<std::chrono::microseconds> spin;
    // How often UCX checks that peers are alive (UCX_KEEPALIVE_INTERVAL when the user
    // has not set it). Over shared memory this bounds how long a killed peer goes
    // unnoticed; over TCP the kernel's reset is seen at once.
    std::chrono::milliseconds keepalive_interval{1000};
    // How long the destructor lets endpoints flush before closing them by force.
    std::chrono::milliseconds close_timeout{1000};
    // Lets error-handling endpoints use shared memory (UCX's MM_ERROR_HANDLING=y). UCX
    // 1.13 gives posix/sysv no lanes on such endpoints otherwise, so same-node messages
    // take TCP loopback: 8-byte latency ~7.6 us instead of ~1.6. The cost: a SIGKILLed
    // peer on shared memory is then noticed only by UCX's keepalive, which misses it in
    // about 3 runs of 8 (its operations run to their deadlines). Turn it on only with a
    // detector of your own calling fail_peer() (World does, through the store). The
    // user's UCX_MM_ERROR_HANDLING / UCX_POSIX_ERROR_HANDLING / UCX_SYSV_ERROR_HANDLING,
    // when set, win either way.
    bool shared_memory_peer_errors = false;
    // Keeps UCX to its network transports (UCX_TLS=^sm, its shared-memory ones, unless the
    // user set UCX_TLS): set by a World whose ranks of other nodes run on this machine and
    // could share its memory, so that bytes between nodes cross the network.
    bool network_only = false;
    // Sends every message eagerly, whatever its size (UCX_RNDV_THRESH=inf unless the user
    // set it): set by a World whose ranks span nodes joined by TCP only. Over one TCP
    // connection a rendezvous's control messages queue behind the bulk data going the
    // other way, so two ranks exchanging large messages (every ring and rail step) share
    // the link as if it were half duplex: 47-53% of a 1 Gbit/s link, against 84-94% eager
    // (docs/architecture.md, "Eager across TCP"). The cost: a message that arrives before
    // its receive is posted waits in UCX's memory, as large as it is.
    bool eager_messages = false;
  };

  // Creates the UCX context and worker on `runtime`'s thread. Throws Error (ucx
  // category) when UCX cannot start.
  explicit UcxWorker(Runtime& runtime);
  UcxWorker(Runtime& runtime, Options options);
  // Fails pending operations with Errc::closed, flushes and closes every endpoint
  // (force-closing those that do not flush within close_timeout), destroys the worker.
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // This worker's UCX address, for the other ranks' connect().
  const Bytes& address() const noexcept;

  // Creates endpoints to every rank (this one included, so a rank can send to itself).
  // addresses_by_rank[r] is rank r's address(); addresses_by_rank[my_rank] must be this
  // worker's. Call once, before any send or recv. Connection set-up finishes in the
  // background; the first messages wait for it.
  void connect(const std::vector<Bytes>& addresses_by_rank, int my_rank);

  int rank() const noexcept;  // -1 before connect()
  int size() const noexcept;  // 0 before connect()
  // Whether this UCX moves CUDA memory itself (built with its CUDA transports). When it
  // does not, send and recv take host memory only and communicators stage CUDA buffers.
  bool moves_cuda_memory() const noexcept;

  // Sends `buffer` (host memory) to `peer`. Completes when the buffer may be reused. UCX
  // cannot cancel a send, so a send still pending at its deadline force-closes the
  // endpoint to `peer` to get the buffer back: it fails with Errc::timeout, and the peer
  // counts as failed from then on.
  asio::awaitable<void> send(int peer, Buffer buffer, Tag tag, Deadline deadline);

  // Receives the message `peer` sent with `tag` into `buffer` (host memory); returns the
  // number of bytes received, which may be less than the buffer's size.
  // Either may take kDefaultDeadline: BRAID_TIMEOUT from when the operation has to wait.
  asio::awaitable<std::size_t> recv(int peer, Buffer buffer, Tag tag, Deadline deadline);

  // send() and recv() in two halves: start now, await later. Starting throws at once what
  // the operation would fail with at once (a failed peer, a bad argument); everything
  // else is thrown by wait(), which returns the bytes received (0 for a send). Spans,
  // errors and deadlines as send() / recv(). Call both on the runtime's thread.
  Transfer start_send(int peer, Buffer buffer, Tag tag, Deadline deadline);
  Transfer start_recv(int peer, Buffer buffer, Tag tag, Deadline deadline);
  asio::awaitable<std::size_t> wait(Transfer& transfer);
  // Cancels a started receive that has not matched a message yet (wait() then fails with
  // Errc::cancelled); one whose message is already arriving finishes first. Sends cannot
  // be cancelled (UCX 1.13): fail_peer() closes the endpoint to get their buffer back.
  void cancel(Transfer& transfer);
  // Cancels every receive still pending with tags of `communicator`'s operation `sequence`
  // whose step `step_matches` (any peer), awaited ones included, which cancel() cannot
  // reach once wait() has taken them: how an operation that a failure aborts gets out of
  // the receive it waits in. Runtime thread only.
  void cancel_receives(std::uint32_t communicator, std::uint64_t sequence,
                       bool (*step_matches)(std::uint32_t step));

  // Calls `listener(peer, reason)` on the runtime thread, after the fact, each time a peer
  // fails (any detector). Communicators use it to abort collectives that wait on other
  // members. Returns an id for remove_peer_failure_listener(). Both from any thread.
  using PeerFailureListener = std::function<void(int peer, const std::string& reason)>;
  std::uint64_t add_peer_failure_listener(PeerFailureListener listener);
  void remove_peer_failure_listener(std::uint64_t id);
  // The reason `peer` failed, or nullopt while it has not. Runtime thread only.
  std::optional<std::string> peer_failure(int peer) const;

  // Declares `peer` failed on the word of a detector outside UCX (World's store watcher,
  // which sees a killed process that UCX's shared-memory keepalive can miss). Exactly
  // what a UCX endpoint error does: every pending operation with `peer` fails with
  // Errc::peer_failed whose message is `reason` (say why, e.g. "its store connection
  // closed"), the endpoint is closed by force, and every later operation with it fails at
  // once. A peer already failed keeps its first reason. Call it after connect(), from any
  // thread (it hops to the runtime thread). Throws Errc::invalid_argument for a peer
  // outside the world.
  //
  // `loss` says whether anything more can arrive from the peer. `gone` (its process ended,
  // its node or the network to it was lost): an operation UCX still holds once the endpoint
  // is closed fails at once, a receive included (UCX 1.13 may never return an eager message
  // that was mid-transfer over TCP). `reachable` (a live process given up on: a collective
  // settling, a send it never received): a send fails at once, but a receive keeps waiting
  // for UCX to let go of its buffer, since the peer's remaining bytes may still land there.
  enum class PeerLoss { reachable, gone };
  void fail_peer(int peer, std::string reason, PeerLoss loss = PeerLoss::reachable);

  // Where each rank runs, for failure messages: every reason rank r fails with ends with
  // `places[r]` (a World of several nodes gives "; it ran on node 1 (node1), with ranks
  // 2-3"). Call after connect(), from any thread.
  void set_peer_places(std::vector<std::string> places);

 private:
  // A Transfer for an operation just started: `op` null when UCX finished it inside the
  // call, with `length` bytes received.
  Transfer started_transfer(detail::UcxOp* op, std::size_t length);

  Runtime& runtime_;
  // Shared with the handlers the worker has queued on the io_context, which may run
  // after the UcxWorker is gone and must find the state they point to.
  std::shared_ptr<detail::UcxWorkerImpl> impl_;
};

}  // namespace braid::transport
