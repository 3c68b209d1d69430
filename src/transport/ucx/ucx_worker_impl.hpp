// Private state of a UcxWorker. Everything here runs on the runtime's progress thread, so
// nothing is locked. Split by concern:
//   ucx_worker.cpp     the public face: hops to the runtime thread, send/recv coroutines
//   ucx_progress.cpp   context/worker set-up and tear-down, the event-fd + spin loop
//   ucx_endpoints.cpp  endpoints, peer failure, closing
//   ucx_ops.cpp        starting sends/receives, completions, the deadline watchdog
#pragma once

#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/intrusive/list.hpp>
#include <ucp/api/ucp.h>

#include <braid/core/error.hpp>
#include <braid/transport/ucx/ucx_worker.hpp>

namespace braid::transport::detail {

class UcxWorkerImpl;

// The suspended coroutine's completion handler, type-erased. (asio::any_completion_handler
// would do, but in Asio 1.26 its executor cannot be posted to, and asio::append recurses
// on it.) One small allocation per operation that UCX does not finish at once.
class OpHandler {
 public:
  virtual ~OpHandler() = default;
  // Posts the result to the handler's own executor; never runs the coroutine inline.
  virtual void post(std::exception_ptr error, std::size_t length) && = 0;
  // Runs the coroutine inline when its executor allows it (the runtime's io_context,
  // called on its thread), else posts. Only progress() uses it, after
  // ucp_worker_progress has returned: see ucx_progress.cpp.
  virtual void dispatch(std::exception_ptr error, std::size_t length) && = 0;
};

enum class OpKind : std::uint8_t { send, recv };

constexpr const char* to_string(OpKind kind) noexcept {
  return kind == OpKind::send ? "send" : "recv";
}

// A send or receive that UCX did not finish at once. Pooled by UcxWorkerImpl (a pending
// operation costs no allocation after warm-up); linked into the pending list from the
// moment UCX hands out a request until UCX gives it back through the completion callback.
struct UcxOp
    : boost::intrusive::list_base_hook<boost::intrusive::link_mode<boost::intrusive::safe_link>> {
  UcxWorkerImpl* owner = nullptr;
  OpKind kind = OpKind::send;
  int peer = -1;
  Tag tag;
  std::size_t capacity = 0;  // the buffer's size in bytes
  Deadline deadline;
  void* request = nullptr;  // the UCX request, until its completion callback
  // Set when braid gave up on the operation (deadline, peer failure, shutdown) and asked
  // UCX to let go of it; the coroutine hears this error once UCX has.
  std::optional<Errc> abandoned;
  // Abandoned, and not returned by UCX when its endpoint was closed by force (a send; a
  // receive when its peer is gone): its waiter has heard the error and the op is out of
  // pending_. UCX 1.13 does not always complete an eager message that was mid-transfer
  // over TCP when its endpoint closed (a link cut). Such an op goes back to the pool only
  // once UCX has returned it and its result was taken (`let_go`).
  bool orphaned = false;
  bool let_go = false;  // orphaned, and its Transfer awaited or dropped
  // Who hears of the completion. A coroutine awaiting the operation attaches `handler`.
  // A Transfer not yet awaited has none: the result is parked here (`finished`) until
  // it is; a Transfer dropped unawaited sets `detached`, and the op goes back to the
  // pool as soon as UCX returns it.
  std::unique_ptr<OpHandler> handler;
  bool detached = false;
  bool finished = false;
  std::exception_ptr error;  // parked result, when `finished`
  std::size_t length = 0;
  // Set while the UCX call that starts the operation runs. UCX may complete the operation
  // inside that call and still return a request (a receive matching a multi-fragment eager
  // message whose fragments have all arrived): finish() then leaves the outcome here for the
  // start call to report as an immediate completion.
  bool starting = false;
  std::optional<std::pair<ucs_status_t, std::size_t>> completed_while_starting;
};

struct UcxPeer {
  UcxWorkerImpl* owner = nullptr;  // the endpoint error callback's argument is the peer
  int rank = -1;
  ucp_ep_h ep = nullptr;
  bool failed = false;
  bool gone = false;    // nothing more arrives from it (UcxWorker::PeerLoss::gone)
  std::string failure;  // why, repeated in the error of every later operation
};

// Result of starting a receive: `op` is null when UCX completed it at once.
struct RecvStart {
  UcxOp* op = nullptr;
  std::size_t received = 0;
};

class UcxWorkerImpl : public std::enable_shared_from_this<UcxWorkerImpl> {
 public:
  UcxWorkerImpl(Runtime& runtime, const UcxWorker::Options& options);
  ~UcxWorkerImpl();

  // ucx_progress.cpp
  void open();
  void shutdown();

  // ucx_endpoints.cpp
  void connect(const std::vector<Bytes>& addresses_by_rank, int my_rank);
  // Marks the peer failed and fails its pending operations with Errc::peer_failed naming
  // `why`: the one path for every detector (UCX's endpoint error callback and
  // UcxWorker::fail_peer). Inside ucp_worker_progress pass close_now = false, so the
  // endpoint is closed from a handler of its own rather than under UCX's feet.
  // `gone`: nothing more arrives from the peer (UcxWorker::PeerLoss).
  void fail_peer(int rank, std::string why, bool close_now, bool gone);

  // ucx_ops.cpp. Both throw Error for operations that fail at once and return null when
  // UCX completed them at once.
  UcxOp* start_send(int peer, const Buffer& buffer, const Tag& tag, Deadline deadline);
  RecvStart start_recv(int peer, const Buffer& buffer, const Tag& tag, Deadline deadline);
  // A Transfer lets go of its op: at once when UCX already finished it, else when it does.
  void detach(UcxOp* op) noexcept;
  // Takes a parked result (rethrowing its error) and returns the op to the pool.
  std::size_t take_result(UcxOp* op);
  // Polls the worker in place, for at most kInPlacePoll, until `op` (started, not yet
  // awaited) finishes; true if it did, its result then parked for take_result(). If
  // polling throws, `op` is detached first. See ucx_progress.cpp.
  bool poll_in_place(UcxOp* op);

  void cancel(UcxOp* op);
  void cancel_receives(std::uint32_t communicator, std::uint64_t sequence,
                       bool (*step_matches)(std::uint32_t step));
  std::uint64_t add_peer_failure_listener(UcxWorker::PeerFailureListener listener);
  void remove_peer_failure_listener(std::uint64_t id);
  const UcxPeer& peer(int rank) const { return peers_.at(static_cast<std::size_t>(rank)); }

  const Bytes& address() const noexcept { return address_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return static_cast<int>(peers_.size()); }
  bool moves_cuda_memory() const noexcept { return moves_cuda_memory_; }

  void set_peer_places(std::vector<std::string> places) { places_ = std::move(places); }

 private:
  // ucx_progress.cpp
  void progress();
  unsigned drain();
  void deliver_completions();
  void post_poll();
  void wait_for_events();
  void teardown_ucx() noexcept;

  // ucx_endpoints.cpp
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  void close_endpoint_by_force(UcxPeer& peer);
  void close_endpoints();

  // ucx_ops.cpp
  static void on_send_complete(void* request, ucs_status_t status, void* user_data);
  static void on_recv_complete(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                               void* user_data);
  void check_can_start(int peer, const Buffer& buffer, const Tag& tag, OpKind kind) const;
  // The op a start hands UCX as its user data. It stays in the pool until track() takes
  // it for an operation UCX did not finish inside the call; most sends never need it.
  UcxOp* spare_op();
  void release_op(UcxOp* op) noexcept;
  // Fills in a started operation and adds it to the pending list the watchdog and peer
  // failures walk.
  void track(UcxOp* op, OpKind kind, int peer, const Tag& tag, std::size_t capacity,
             Deadline deadline, void* request);
  void finish(UcxOp* op, void* request, ucs_status_t status, std::size_t length);
  // After the call that starts `op`: the outcome when UCX completed it inside that call.
  static std::optional<std::pair<ucs_status_t, std::size_t>> completed_while_starting(
      UcxOp* op) noexcept;
  void abandon(UcxOp* op, Errc why);
  // See UcxOp::orphaned.
  void orphan(UcxOp* op);
  // The error an abandoned op's waiter hears.
  Error abandoned_error(const UcxOp& op) const;
  // Hands the outcome to the op's waiter (or parks it for a Transfer not yet awaited).
  void deliver(UcxOp* op, std::exception_ptr error, std::size_t length);
  std::vector<UcxOp*> pending_snapshot() const;
  Error make_error(int peer, OpKind kind, const Tag& tag, std::size_t capacity, ucs_status_t status,
                   std::size_t length) const;
  ErrorContext context(int peer, OpKind kind, const Tag& tag) const;
  void arm_watchdog(Deadline when);
  void on_watchdog();

  Runtime& runtime_;
  std::chrono::nanoseconds spin_;
  std::chrono::milliseconds keepalive_interval_;
  bool shared_memory_peer_errors_;
  bool network_only_;
  bool eager_messages_;
  std::chrono::milliseconds close_timeout_;

  ucp_context_h context_ = nullptr;
  bool moves_cuda_memory_ = false;  // UCX was built with CUDA transports (cuda_copy, ...)
  ucp_worker_h worker_ = nullptr;
  Bytes address_;
  int rank_ = -1;
  // Sized once by connect(); endpoint error callbacks hold pointers into it.
  std::vector<UcxPeer> peers_;
  std::vector<std::string> places_;  // UcxWorker::set_peer_places; empty: none
  bool closed_ = false;

  // Progress: at any time either a poll is posted (spinning) or the worker is armed and
  // a wait on its event fd is outstanding (both, briefly, while a spin starts).
  std::optional<asio::posix::stream_descriptor> event_fd_;
  bool poll_posted_ = false;
  bool fd_wait_outstanding_ = false;
  Clock::time_point last_activity_{};
  bool activity_ = false;  // an operation started since progress() last looked
  // Completions found by drain(), delivered by progress() once UCX has returned; `ready_`
  // is the batch being delivered (two vectors so that neither allocates after warm-up).
  struct Completion {
    std::unique_ptr<OpHandler> handler;
    std::exception_ptr error;
    std::size_t length = 0;
  };
  bool draining_ = false;
  std::vector<Completion> completed_;
  std::vector<Completion> ready_;

  boost::intrusive::list<UcxOp, boost::intrusive::constant_time_size<false>> pending_;
  std::vector<UcxOp*> orphans_;  // UcxOp::orphaned, UCX's still
  std::vector<UcxOp*> free_ops_;
  std::vector<std::unique_ptr<UcxOp>> all_ops_;

  // One timer for every deadline: armed at the earliest deadline among pending
  // operations (re-armed only when a new one is earlier), so starting an operation costs
  // no timer syscall in the common case of deadlines that only grow.
  std::vector<std::pair<std::uint64_t, UcxWorker::PeerFailureListener>> failure_listeners_;
  std::uint64_t next_listener_id_ = 1;

  std::optional<asio::steady_timer> watchdog_;
  Deadline watchdog_expiry_ = Deadline::max();
};

}  // namespace braid::transport::detail
