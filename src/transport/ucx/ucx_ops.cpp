// Starting tagged sends and receives, their completions, and the deadline watchdog.
//
// Hot path: a send or receive that UCX completes inside the call (an eager send, a
// receive whose message already arrived) never suspends the coroutine and allocates
// nothing. One that UCX must finish later takes an UcxOp from a pool, links it into the
// pending list and suspends. The completion callback runs inside ucp_worker_progress and
// never resumes the coroutine there: from progress()'s drain it queues the result, which
// progress() hands over once UCX has returned (see ucx_progress.cpp); from anywhere else
// (a cancel, a forced close, the watchdog's keepalive calls) it posts the result to the
// coroutine's executor.
//
// Deadlines without a timer per operation (an Asio timer costs a timerfd_settime when it
// becomes the earliest): one watchdog timer is armed at the earliest pending deadline.
// When it fires, each expired operation is abandoned:
//   - a receive is cancelled (ucp_request_cancel): an unmatched receive completes at once
//     with UCS_ERR_CANCELED and fails with Errc::timeout. A receive whose message is
//     already arriving (rendezvous in progress) cannot be cancelled; it finishes (late
//     success is reported as success) or fails with its sender.
//   - a send cannot be cancelled in UCX 1.13, so the endpoint to its peer is closed by
//     force, which completes its sends with UCS_ERR_CANCELED; the peer counts as failed.
// In every case the coroutine hears of the failure only from the UCX completion callback,
// that is after UCX has released the request and will no longer touch the buffer; the
// UcxOp stays linked (and the watchdog skips it) until then.
#include <algorithm>

#include <fmt/format.h>

#include <braid/core/log.hpp>
#include <braid/transport/ucx/ucx_error.hpp>

#include "transport/ucx/ucx_worker_impl.hpp"

namespace braid::transport::detail {
namespace {

// Statuses that mean the other side is gone or unreachable.
bool is_peer_failure(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_CANCELED:
      return true;
    default:
      return false;
  }
}

std::string describe(const Tag& tag) {
  return fmt::format("communicator {}, sequence {}, step {}", tag.communicator, tag.sequence,
                     tag.step);
}

}  // namespace

ErrorContext UcxWorkerImpl::context(int peer, OpKind kind, const Tag& tag) const {
  return {.rank = rank_, .peer = peer, .operation = to_string(kind), .sequence = tag.sequence};
}

void UcxWorkerImpl::check_can_start(int peer, const Buffer& buffer, const Tag& tag,
                                    OpKind kind) const {
  BRAID_ENFORCE(runtime_.on_runtime_thread(),
                "UcxWorker::{} must be awaited by a coroutine on the runtime's thread",
                to_string(kind));
  if (closed_) throw Error(Errc::closed, "the UCX worker was shut down", context(peer, kind, tag));
  BRAID_ENFORCE(!peers_.empty(), "UcxWorker::{} before connect()", to_string(kind));
  if (peer < 0 || peer >= size()) [[unlikely]] {
    throw Error(Errc::invalid_argument,
                fmt::format("peer rank {} is outside the world of {} ranks", peer, size()),
                context(peer, kind, tag));
  }
  if (buffer.memory() != MemoryKind::host && !moves_cuda_memory_) [[unlikely]] {
    throw Error(Errc::invalid_argument,
                fmt::format("the buffer is {} memory (device {}); this UCX was built without "
                            "CUDA support and moves host memory only (communicators stage CUDA "
                            "buffers through host memory)",
                            to_string(buffer.memory()), buffer.device()),
                context(peer, kind, tag));
  }
  if (tag.communicator >= max_communicators) [[unlikely]] {
    throw Error(Errc::invalid_argument,
                fmt::format("communicator id {} does not fit the tag (at most {})",
                            tag.communicator, max_communicators - 1),
                context(peer, kind, tag));
  }
  if (peers_[peer].failed) [[unlikely]] {
    throw Error(Errc::peer_failed, peers_[peer].failure, context(peer, kind, tag));
  }
}

UcxOp* UcxWorkerImpl::spare_op() {
  if (free_ops_.empty()) {
    all_ops_.push_back(std::make_unique<UcxOp>());
    all_ops_.back()->owner = this;
    // release_op() can then take every op back without allocating.
    free_ops_.reserve(all_ops_.size());
    free_ops_.push_back(all_ops_.back().get());
  }
  return free_ops_.back();
}

void UcxWorkerImpl::release_op(UcxOp* op) noexcept {
  if (op->orphaned) {  // UCX may yet call back with it: reused once it has
    op->let_go = true;
    return;
  }
  op->request = nullptr;
  op->abandoned.reset();
  op->detached = false;
  op->finished = false;
  op->error = nullptr;
  op->length = 0;
  free_ops_.push_back(op);
}

void UcxWorkerImpl::detach(UcxOp* op) noexcept {
  if (op->finished) {
    release_op(op);
    return;
  }
  op->detached = true;
  // Nobody will read this receive: cancel it so that UCX stops short of writing into a
  // buffer its owner may reuse (an unmatched receive completes inside the cancel call; one
  // whose message is already arriving finishes first). A send has to run its course.
  if (op->kind == OpKind::recv && !op->abandoned && !closed_) abandon(op, Errc::cancelled);
}

void UcxWorkerImpl::cancel(UcxOp* op) {
  if (op->kind == OpKind::recv && !op->finished && !op->abandoned && !closed_) {
    abandon(op, Errc::cancelled);
    // The cancelled receive's completion waits in the queue progress() delivers: called
    // from outside progress (a listener aborting an operation), nothing else may run it
    // before the worker's next event or deadline.
    post_poll();
  }
}

void UcxWorkerImpl::cancel_receives(std::uint32_t communicator, std::uint64_t sequence,
                                    bool (*step_matches)(std::uint32_t step)) {
  for (UcxOp* op : pending_snapshot()) {
    if (op->tag.communicator == communicator && op->tag.sequence == sequence &&
        step_matches(op->tag.step)) {
      cancel(op);
    }
  }
}

std::size_t UcxWorkerImpl::take_result(UcxOp* op) {
  const std::exception_ptr error = std::move(op->error);
  const std::size_t length = op->length;
  release_op(op);
  if (error) std::rethrow_exception(error);
  return length;
}

void UcxWorkerImpl::track(UcxOp* op, OpKind kind, int peer, const Tag& tag, std::size_t capacity,
                          Deadline deadline, void* request) {
  op->kind = kind;
  op->peer = peer;
  op->tag = tag;
  op->capacity = capacity;
  op->deadline = deadline == kDefaultDeadline ? default_deadline() : deadline;
  op->request = request;
  // UCX kept the request: the spare op handed to it as user data leaves the pool. It is
  // still on top unless a completion ran inside the start call and returned an op.
  if (free_ops_.back() == op) {
    free_ops_.pop_back();
  } else {
    free_ops_.erase(std::find(free_ops_.begin(), free_ops_.end(), op));
  }
  pending_.push_back(*op);
  if (op->deadline < watchdog_expiry_) arm_watchdog(op->deadline);
  activity_ = true;
  post_poll();
}

namespace {
// Telling UCX the memory type saves it a pointer lookup per message.
ucs_memory_type_t memory_type_of(const Buffer& buffer) {
  return buffer.memory() == MemoryKind::cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
}
}  // namespace

UcxOp* UcxWorkerImpl::start_send(int peer, const Buffer& buffer, const Tag& tag,
                                 Deadline deadline) {
  check_can_start(peer, buffer, tag, OpKind::send);
  UcxOp* op = spare_op();
  ucp_request_param_t params{};
  params.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  params.cb.send = &UcxWorkerImpl::on_send_complete;
  params.user_data = op;
  params.memory_type = memory_type_of(buffer);
  op->starting = true;
  void* request = ucp_tag_send_nbx(peers_[peer].ep, buffer.data(), buffer.size_bytes(),
                                   encode_tag(tag, static_cast<std::uint32_t>(rank_)), &params);
  const auto early = completed_while_starting(op);
  if (!UCS_PTR_IS_PTR(request) || early) {
    activity_ = true;
    const ucs_status_t status = early ? early->first : UCS_PTR_STATUS(request);
    if (status == UCS_OK) return nullptr;
    throw make_error(peer, OpKind::send, tag, buffer.size_bytes(), status, 0);
  }
  track(op, OpKind::send, peer, tag, buffer.size_bytes(), deadline, request);
  return op;
}

RecvStart UcxWorkerImpl::start_recv(int peer, const Buffer& buffer, const Tag& tag,
                                    Deadline deadline) {
  check_can_start(peer, buffer, tag, OpKind::recv);
  const ucp_tag_t wire_tag = encode_tag(tag, static_cast<std::uint32_t>(peer));
  // UCX 1.13 leaves param.recv_info unwritten when a receive completes at once, so the
  // length comes from a probe of the unexpected queue: the receive below takes the same
  // message (nothing runs in between). One hash lookup; when nothing has arrived the
  // receive cannot complete at once and the callback reports the length.
  ucp_tag_recv_info_t info{};
  ucp_tag_probe_nb(worker_, wire_tag, tag_mask_exact, 0, &info);
  UcxOp* op = spare_op();
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FIELD_RECV_INFO;
  params.cb.recv = &UcxWorkerImpl::on_recv_complete;
  params.user_data = op;
  params.memory_type = memory_type_of(buffer);
  ucp_tag_recv_info_t ignored{};
  params.recv_info.tag_info = &ignored;
  op->starting = true;
  void* request = ucp_tag_recv_nbx(worker_, buffer.data(), buffer.size_bytes(), wire_tag,
                                   tag_mask_exact, &params);
  const auto early = completed_while_starting(op);
  if (!UCS_PTR_IS_PTR(request) || early) {
    activity_ = true;
    const ucs_status_t status = early ? early->first : UCS_PTR_STATUS(request);
    const std::size_t length = early ? early->second : info.length;
    if (status == UCS_OK) return {.op = nullptr, .received = length};
    throw make_error(peer, OpKind::recv, tag, buffer.size_bytes(), status, length);
  }
  track(op, OpKind::recv, peer, tag, buffer.size_bytes(), deadline, request);
  return {.op = op, .received = 0};
}

void UcxWorkerImpl::on_send_complete(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<UcxOp*>(user_data);
  op->owner->finish(op, request, status, 0);
}

void UcxWorkerImpl::on_recv_complete(void* request, ucs_status_t status,
                                     const ucp_tag_recv_info_t* info, void* user_data) {
  auto* op = static_cast<UcxOp*>(user_data);
  // info describes the message only when one was matched.
  const bool matched = status == UCS_OK || status == UCS_ERR_MESSAGE_TRUNCATED;
  op->owner->finish(op, request, status, matched ? info->length : 0);
}

std::optional<std::pair<ucs_status_t, std::size_t>> UcxWorkerImpl::completed_while_starting(
    UcxOp* op) noexcept {
  op->starting = false;
  return std::exchange(op->completed_while_starting, std::nullopt);
}

void UcxWorkerImpl::finish(UcxOp* op, void* request, ucs_status_t status, std::size_t length) {
  if (request != nullptr) ucp_request_free(request);
  if (op->starting) {
    // Inside the call that starts it: that call reports the outcome (see UcxOp::starting).
    op->completed_while_starting.emplace(status, length);
    return;
  }
  if (op->orphaned) {
    // Its waiter heard already; UCX has let go of it at last.
    std::erase(orphans_, op);
    op->orphaned = false;
    if (std::exchange(op->let_go, false)) release_op(op);
    return;
  }
  pending_.erase(pending_.iterator_to(*op));
  std::exception_ptr error;
  if (status != UCS_OK) {
    error = std::make_exception_ptr(
        op->abandoned && status == UCS_ERR_CANCELED
            ? abandoned_error(*op)
            : make_error(op->peer, op->kind, op->tag, op->capacity, status, length));
  }
  deliver(op, std::move(error), length);
}

Error UcxWorkerImpl::abandoned_error(const UcxOp& op) const {
  const Errc why = *op.abandoned;
  return Error(
      why,
      why == Errc::timeout
          ? fmt::format("no {} rank {} ({}) before the deadline",
                        op.kind == OpKind::send ? "matching receive posted by" : "message from",
                        op.peer, describe(op.tag))
      : why == Errc::peer_failed ? peers_[op.peer].failure
      : why == Errc::cancelled   ? std::string("cancelled by its caller")
                                 : std::string("the UCX worker was shut down"),
      context(op.peer, op.kind, op.tag));
}

void UcxWorkerImpl::orphan(UcxOp* op) {
  log::debug(
      "ucx: UCX kept a {} with rank {} ({}) as its endpoint closed; its waiter hears "
      "the failure now",
      to_string(op->kind), op->peer, describe(op->tag));
  pending_.erase(pending_.iterator_to(*op));
  op->orphaned = true;
  orphans_.push_back(op);
  deliver(op, std::make_exception_ptr(abandoned_error(*op)), 0);
}

void UcxWorkerImpl::deliver(UcxOp* op, std::exception_ptr error, std::size_t length) {
  if (op->handler == nullptr) {
    // Started as a Transfer and not awaited (yet): park the result, or drop it when the
    // Transfer is gone.
    if (op->detached) {
      release_op(op);
    } else {
      op->finished = true;
      op->error = std::move(error);
      op->length = length;
    }
    return;
  }
  std::unique_ptr<OpHandler> handler = std::move(op->handler);
  release_op(op);
  if (draining_) {
    completed_.push_back({std::move(handler), std::move(error), length});
  } else {
    std::move(*handler).post(std::move(error), length);
  }
}

Error UcxWorkerImpl::make_error(int peer, OpKind kind, const Tag& tag, std::size_t capacity,
                                ucs_status_t status, std::size_t length) const {
  if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    return Error(Errc::size_mismatch,
                 fmt::format("the message from rank {} ({}) is {} bytes, the receive buffer "
                             "holds {} bytes",
                             peer, describe(tag), length, capacity),
                 context(peer, kind, tag));
  }
  if (is_peer_failure(status) || peers_[peer].failed) {
    return Error(Errc::peer_failed,
                 peers_[peer].failed ? peers_[peer].failure
                                     : fmt::format("{} (ucx {})", ucs_status_string(status),
                                                   static_cast<int>(status)),
                 context(peer, kind, tag));
  }
  return Error(make_ucx_error_code(status), describe(tag), context(peer, kind, tag));
}

std::vector<UcxOp*> UcxWorkerImpl::pending_snapshot() const {
  std::vector<UcxOp*> ops;
  for (const UcxOp& op : pending_) ops.push_back(const_cast<UcxOp*>(&op));
  return ops;
}

void UcxWorkerImpl::abandon(UcxOp* op, Errc why) {
  op->abandoned = why;
  if (op->kind == OpKind::recv) {
    // Completes an unmatched receive inside this call (finish() runs, op is released).
    ucp_request_cancel(worker_, op->request);
    return;
  }
  if (why == Errc::timeout) {
    fail_peer(op->peer,
              fmt::format("a send to it ({}) passed its deadline, and its endpoint was closed "
                          "so that UCX would release the send buffer",
                          describe(op->tag)),
              /*close_now=*/true, /*gone=*/false);
  }
  // Otherwise (peer failed, shutdown) closing the endpoint completes the send.
}

void UcxWorkerImpl::arm_watchdog(Deadline when) {
  // Also a keepalive tick: see on_watchdog().
  when = std::min(when, Clock::now() + keepalive_interval_);
  watchdog_expiry_ = when;
  watchdog_->expires_at(when);
  watchdog_->async_wait([self = shared_from_this()](const boost::system::error_code& error) {
    if (error == asio::error::operation_aborted || self->closed_) return;
    self->on_watchdog();
  });
}

void UcxWorkerImpl::on_watchdog() {
  watchdog_expiry_ = Deadline::max();
  // UCX 1.13 runs its keepalive round (the only way a killed peer on shared memory is
  // noticed) from inside ucp_worker_progress, once per UCX_KEEPALIVE_INTERVAL and only on
  // every 32nd call (UCP_WORKER_KEEPALIVE_ITER_SKIP); nothing wakes a sleeping worker for
  // it. So while operations wait, the watchdog fires at least once per interval and makes
  // those calls: a few microseconds per second.
  constexpr int keepalive_iter_skip = 32;
  for (int i = 0; i < keepalive_iter_skip; ++i) ucp_worker_progress(worker_);
  const auto now = Clock::now();
  std::vector<UcxOp*> expired;
  Deadline next = Deadline::max();
  for (UcxOp& op : pending_) {
    if (op.abandoned) continue;  // already let go of; waiting for UCX to return it
    if (op.deadline <= now) {
      expired.push_back(&op);
    } else {
      next = std::min(next, op.deadline);
    }
  }
  // Abandoning one operation can finish others (closing an endpoint completes all its
  // sends), so each is checked before it is touched. Pooled ops are never freed, and none
  // is reused before this loop ends, so the check is sound.
  for (UcxOp* op : expired) {
    if (op->is_linked() && !op->abandoned) abandon(op, Errc::timeout);
  }
  if (next != Deadline::max()) arm_watchdog(next);
  progress();  // the calls above may have completed work outside the arm/wait cycle
}

}  // namespace braid::transport::detail
