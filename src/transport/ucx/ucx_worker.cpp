#include <utility>

#include <boost/asio/append.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <braid/trace/span.hpp>

#include "transport/ucx/ucx_worker_impl.hpp"

namespace braid::transport {
namespace {

// Suspends the calling coroutine until UCX finishes `op`. The handler is attached before
// anything else can run on the runtime thread (the initiation runs synchronously right
// after the coroutine suspends), and UCX completes requests only inside
// ucp_worker_progress, which runs from the io_context: so the completion always finds
// the handler in place.
template <class Handler>
class HandlerFor final : public detail::OpHandler {
 public:
  explicit HandlerFor(Handler handler) : handler_(std::move(handler)) {}
  void post(std::exception_ptr error, std::size_t length) && override {
    asio::post(asio::append(std::move(handler_), std::move(error), length));
  }
  void dispatch(std::exception_ptr error, std::size_t length) && override {
    asio::dispatch(asio::append(std::move(handler_), std::move(error), length));
  }

 private:
  Handler handler_;
};

auto wait_for(detail::UcxOp& op) {
  return asio::async_initiate<const asio::use_awaitable_t<>&,
                              void(std::exception_ptr, std::size_t)>(
      [&op]<class Handler>(Handler handler) {
        op.handler = std::make_unique<HandlerFor<Handler>>(std::move(handler));
      },
      asio::use_awaitable);
}

}  // namespace

UcxWorker::UcxWorker(Runtime& runtime) : UcxWorker(runtime, Options{}) {}

UcxWorker::UcxWorker(Runtime& runtime, Options options)
    : runtime_(runtime), impl_(std::make_shared<detail::UcxWorkerImpl>(runtime, options)) {
  runtime_.run([this] { impl_->open(); });
}

UcxWorker::~UcxWorker() {
  // The I/O objects inside impl_ belong to the runtime thread, so the last reference this
  // object holds is dropped there too.
  runtime_.run([this] {
    impl_->shutdown();
    impl_.reset();
  });
}

const Bytes& UcxWorker::address() const noexcept {
  return impl_->address();
}

void UcxWorker::connect(const std::vector<Bytes>& addresses_by_rank, int my_rank) {
  runtime_.run([&] { impl_->connect(addresses_by_rank, my_rank); });
}

void UcxWorker::set_peer_places(std::vector<std::string> places) {
  runtime_.run([&] { impl_->set_peer_places(std::move(places)); });
}

void UcxWorker::fail_peer(int peer, std::string reason, PeerLoss loss) {
  runtime_.run([&] {
    if (peer < 0 || peer >= impl_->size()) {
      throw Error(Errc::invalid_argument,
                  fmt::format("fail_peer({}) names no rank of a world of {}", peer, impl_->size()),
                  {.rank = impl_->rank(), .peer = peer, .operation = "ucx.fail_peer"});
    }
    // Not inside ucp_worker_progress here, so the endpoint may close at once.
    impl_->fail_peer(peer, std::move(reason), /*close_now=*/true, loss == PeerLoss::gone);
  });
}

int UcxWorker::rank() const noexcept {
  return impl_->rank();
}
int UcxWorker::size() const noexcept {
  return impl_->size();
}
bool UcxWorker::moves_cuda_memory() const noexcept {
  return impl_->moves_cuda_memory();
}

// Each message is a transport span on the runtime thread's track: from the call to the
// buffer being released (send) or filled (recv). Off, a span costs one relaxed load.
asio::awaitable<void> UcxWorker::send(int peer, Buffer buffer, Tag tag, Deadline deadline) {
  trace::AsyncSpan span(trace::Category::transport, "ucx.send", {}, buffer.size_bytes());
  span.arg("peer", peer);
  span.arg("seq", static_cast<std::int64_t>(tag.sequence));
  Transfer transfer = start_send(peer, buffer, tag, deadline);
  // Done at once (a short eager send): no frame for wait().
  if (transfer.op_ == nullptr) co_return;
  co_await wait(transfer);
}

asio::awaitable<std::size_t> UcxWorker::recv(int peer, Buffer buffer, Tag tag, Deadline deadline) {
  trace::AsyncSpan span(trace::Category::transport, "ucx.recv");
  span.arg("peer", peer);
  span.arg("seq", static_cast<std::int64_t>(tag.sequence));
  const detail::RecvStart started = impl_->start_recv(peer, buffer, tag, deadline);
  std::size_t received = started.received;
  if (started.op != nullptr) {
    // Found by polling in place (the usual case for a reply), the result is taken here:
    // no Transfer (whose share of the worker state costs an atomic count each way) and no
    // frame for wait().
    if (impl_->poll_in_place(started.op)) {
      received = impl_->take_result(started.op);
    } else {
      Transfer transfer = started_transfer(started.op, 0);
      received = co_await wait(transfer);
    }
  }
  span.set_bytes(received);
  co_return received;
}

Transfer UcxWorker::start_send(int peer, Buffer buffer, Tag tag, Deadline deadline) {
  return started_transfer(impl_->start_send(peer, buffer, tag, deadline), 0);
}

Transfer UcxWorker::start_recv(int peer, Buffer buffer, Tag tag, Deadline deadline) {
  const detail::RecvStart started = impl_->start_recv(peer, buffer, tag, deadline);
  return started_transfer(started.op, started.received);
}

Transfer UcxWorker::started_transfer(detail::UcxOp* op, std::size_t length) {
  Transfer transfer;
  transfer.op_ = op;
  transfer.length_ = length;
  if (op != nullptr) transfer.impl_ = impl_;
  transfer.started_ = true;
  return transfer;
}

asio::awaitable<std::size_t> UcxWorker::wait(Transfer& transfer) {
  BRAID_ENFORCE(transfer.started_,
                "UcxWorker::wait on a Transfer that was not started or was "
                "already awaited");
  detail::UcxOp* op = std::exchange(transfer.op_, nullptr);
  std::size_t length = transfer.length_;
  // Hold the worker state until the op is back in its pool, whatever happens below.
  std::shared_ptr<detail::UcxWorkerImpl> impl = std::move(transfer.impl_);
  transfer.reset();
  if (op == nullptr) co_return length;
  if (op->finished) co_return impl->take_result(op);
  // Only a wait that suspends is a span: the time a coroutine sat waiting on the wire.
  const trace::AsyncSpan waiting(trace::Category::transport, "ucx.wait");
  co_return co_await wait_for(*op);
}

void UcxWorker::cancel(Transfer& transfer) {
  if (transfer.op_ != nullptr) impl_->cancel(transfer.op_);
}

void UcxWorker::cancel_receives(std::uint32_t communicator, std::uint64_t sequence,
                                bool (*step_matches)(std::uint32_t step)) {
  impl_->cancel_receives(communicator, sequence, step_matches);
}

std::uint64_t UcxWorker::add_peer_failure_listener(PeerFailureListener listener) {
  return runtime_.run([&] { return impl_->add_peer_failure_listener(std::move(listener)); });
}

void UcxWorker::remove_peer_failure_listener(std::uint64_t id) {
  runtime_.run([&] {
    if (impl_ != nullptr) impl_->remove_peer_failure_listener(id);
  });
}

std::optional<std::string> UcxWorker::peer_failure(int peer) const {
  const detail::UcxPeer& state = impl_->peer(peer);
  if (!state.failed) return std::nullopt;
  return state.failure;
}

bool Transfer::ready() const noexcept {
  return op_ == nullptr || op_->finished;
}

Transfer::Transfer(Transfer&& other) noexcept
    : impl_(std::move(other.impl_)),
      op_(std::exchange(other.op_, nullptr)),
      length_(other.length_),
      started_(std::exchange(other.started_, false)) {}

Transfer& Transfer::operator=(Transfer&& other) noexcept {
  if (this != &other) {
    reset();
    impl_ = std::move(other.impl_);
    op_ = std::exchange(other.op_, nullptr);
    length_ = other.length_;
    started_ = std::exchange(other.started_, false);
  }
  return *this;
}

Transfer::~Transfer() {
  reset();
}

void Transfer::reset() noexcept {
  if (op_ != nullptr) impl_->detach(op_);
  op_ = nullptr;
  impl_.reset();
  length_ = 0;
  started_ = false;
}

}  // namespace braid::transport
