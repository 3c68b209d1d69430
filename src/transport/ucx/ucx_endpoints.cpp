// Endpoints to peers, what happens when one fails, and closing them.
//
// Peer failure. Endpoints use UCP_ERR_HANDLING_MODE_PEER. When UCX reports an endpoint
// error (inside ucp_worker_progress), the peer is marked failed; its pending receives are
// cancelled (ucp_request_cancel completes an unmatched receive at once) and its endpoint
// is force-closed, which completes its pending sends with UCS_ERR_CANCELED. Each of those
// operations then fails with Errc::peer_failed naming the peer, and so does every later
// operation with it. What UCX 1.13 notices for a SIGKILLed peer process (ucx_test,
// UcxPeerFailure), and how fast:
//   - TCP (UCX_TLS=tcp): the kernel resets the sockets; noticed in ~10 ms.
//   - default transports: error-handling endpoints get posix/sysv lanes only with
//     UCX_MM_ERROR_HANDLING=y (UCX's default is n), so small messages travel over TCP
//     loopback (~4 us one way instead of ~0.5) and the TCP reset is noticed in ~10 ms.
//     UCX 1.13 gives error-handling endpoints no cma lane either (ucp_ep_print_info), so
//     4 MiB rendezvous is pipelined through TCP.
//   - UCX_MM_ERROR_HANDLING=y (user's choice; braid could set it in-process, since
//     ucp_config_modify passes names UCP does not know to every transport's config when
//     the worker opens its interfaces, ucp_apply_uct_config_list): nothing breaks on the
//     wire; UCX's keepalive checks that the peer process still exists once per
//     UCX_KEEPALIVE_INTERVAL (braid sets Options::keepalive_interval, 1 s, unless the
//     user set the variable). UCX 1.13 runs keepalive only inside ucp_worker_progress, so
//     the watchdog (ucx_ops.cpp) ticks once per interval while operations wait; noticed
//     within one to two intervals (197 ms with a 200 ms interval) -- but only in about
//     5 runs of 8 of UcxPeerFailure: in the others no keepalive round ever fails and the
//     operations run into their deadlines. That is why braid does not set it by default.
// Detectors outside UCX (World's store watcher, which sees a killed process's store
// connection close) take the same path: UcxWorker::fail_peer calls fail_peer() below.
#include <algorithm>

#include <boost/asio/post.hpp>
#include <fmt/format.h>

#include <braid/core/log.hpp>
#include <braid/transport/ucx/ucx_error.hpp>

#include "transport/ucx/ucx_worker_impl.hpp"

namespace braid::transport::detail {

void UcxWorkerImpl::connect(const std::vector<Bytes>& addresses_by_rank, int my_rank) {
  BRAID_ENFORCE(peers_.empty(), "UcxWorker::connect() was already called");
  const auto world = addresses_by_rank.size();
  if (world == 0 || world > max_ranks) {
    throw Error(
        Errc::invalid_argument,
        fmt::format("a world of {} ranks; the UCX transport supports 1 to {}", world, max_ranks),
        {.rank = my_rank, .operation = "ucx.connect"});
  }
  if (my_rank < 0 || static_cast<std::size_t>(my_rank) >= world) {
    throw Error(Errc::invalid_argument,
                fmt::format("rank {} is outside a world of {} ranks", my_rank, world),
                {.rank = my_rank, .operation = "ucx.connect"});
  }
  if (addresses_by_rank[my_rank] != address_) {
    throw Error(Errc::invalid_argument,
                fmt::format("addresses_by_rank[{}] is not this worker's address; are the "
                            "addresses in rank order?",
                            my_rank),
                {.rank = my_rank, .operation = "ucx.connect"});
  }
  rank_ = my_rank;
  peers_.resize(world);
  for (std::size_t r = 0; r < world; ++r) {
    UcxPeer& peer = peers_[r];
    peer.owner = this;
    peer.rank = static_cast<int>(r);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(addresses_by_rank[r].data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &UcxWorkerImpl::on_endpoint_error;
    params.err_handler.arg = &peer;
    BRAID_UCX_CHECK(ucp_ep_create(worker_, &params, &peer.ep),
                    {.rank = rank_, .peer = peer.rank, .operation = "ucx.connect"});
    log::debug("ucx: endpoint to rank {} created ({} address bytes)", r,
               addresses_by_rank[r].size());
  }
}

void UcxWorkerImpl::on_endpoint_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<UcxPeer*>(arg);
  // Inside ucp_worker_progress: cancel receives now, close the endpoint from a handler of
  // its own rather than under UCX's feet.
  peer->owner->fail_peer(peer->rank,
                         fmt::format("its endpoint failed: {} (ucx {})", ucs_status_string(status),
                                     static_cast<int>(status)),
                         /*close_now=*/false, /*gone=*/true);
}

void UcxWorkerImpl::fail_peer(int rank, std::string why, bool close_now, bool gone) {
  UcxPeer& peer = peers_[rank];
  peer.gone = peer.gone || gone;
  if (peer.failed) return;
  peer.failed = true;
  peer.failure = std::move(why);
  if (static_cast<std::size_t>(rank) < places_.size()) {
    peer.failure += places_[static_cast<std::size_t>(rank)];
  }

  std::vector<UcxOp*> affected = pending_snapshot();
  std::erase_if(affected, [rank](const UcxOp* op) { return op->peer != rank || op->abandoned; });
  // A failure nobody waits on (a peer that shut down first) is routine; one that breaks
  // operations is worth a warning.
  if (affected.empty()) {
    log::debug("ucx: rank {} failed: {}", rank, peer.failure);
  } else {
    log::warn("ucx: rank {} failed with {} operations pending: {}", rank, affected.size(),
              peer.failure);
  }
  for (UcxOp* op : affected) {
    if (op->is_linked()) abandon(op, Errc::peer_failed);
  }
  // Listeners run later, from a handler of their own: this may be inside
  // ucp_worker_progress, and they start and cancel operations.
  if (!failure_listeners_.empty()) {
    asio::post(runtime_.context(), [self = shared_from_this(), rank] {
      if (self->closed_) return;
      const auto listeners = self->failure_listeners_;  // a listener may remove itself
      for (const auto& [id, listener] : listeners) listener(rank, self->peers_[rank].failure);
    });
  }
  if (close_now) {
    close_endpoint_by_force(peer);
  } else {
    asio::post(runtime_.context(), [self = shared_from_this(), rank] {
      if (!self->closed_) self->close_endpoint_by_force(self->peers_[rank]);
    });
  }
}

std::uint64_t UcxWorkerImpl::add_peer_failure_listener(UcxWorker::PeerFailureListener listener) {
  const std::uint64_t id = next_listener_id_++;
  failure_listeners_.emplace_back(id, std::move(listener));
  return id;
}

void UcxWorkerImpl::remove_peer_failure_listener(std::uint64_t id) {
  std::erase_if(failure_listeners_, [id](const auto& entry) { return entry.first == id; });
}

void UcxWorkerImpl::close_endpoint_by_force(UcxPeer& peer) {
  if (peer.ep == nullptr) return;
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  // Completes the endpoint's outstanding sends with UCS_ERR_CANCELED, synchronously.
  void* request = ucp_ep_close_nbx(peer.ep, &params);
  peer.ep = nullptr;
  if (UCS_PTR_IS_PTR(request)) ucp_request_free(request);  // UCX finishes it on its own
  log::debug("ucx: endpoint to rank {} closed by force", peer.rank);
  // What the close completed (cancelled sends, receives) comes back through progress.
  while (ucp_worker_progress(worker_) != 0) {
  }
  // UCX may never return an eager message that was mid-transfer over TCP when its endpoint
  // closed (UcxOp::orphaned). It reads no send buffer of a closed endpoint, so such sends'
  // waiters hear their failure now; a receive's buffer may still take the bytes of a peer
  // that is alive, so only a peer that is gone lets its receives go the same way.
  for (UcxOp* op : pending_snapshot()) {
    if (op->is_linked() && op->peer == peer.rank && op->abandoned &&
        (op->kind == OpKind::send || peer.gone)) {
      orphan(op);
    }
  }
  post_poll();
}

void UcxWorkerImpl::close_endpoints() {
  // Flush what is in flight to live peers, for at most close_timeout, then close every
  // endpoint by force: a flush-mode close cannot be abandoned once started, a flush can.
  const auto deadline = Clock::now() + close_timeout_;
  std::vector<void*> flushes;
  ucp_request_param_t params{};
  for (UcxPeer& peer : peers_) {
    if (peer.ep == nullptr || peer.failed) continue;
    void* request = ucp_ep_flush_nbx(peer.ep, &params);
    if (UCS_PTR_IS_PTR(request)) flushes.push_back(request);
  }
  auto unfinished = [](void* request) {
    return ucp_request_check_status(request) == UCS_INPROGRESS;
  };
  while (std::any_of(flushes.begin(), flushes.end(), unfinished) && Clock::now() < deadline) {
    ucp_worker_progress(worker_);
  }
  const auto stuck = std::count_if(flushes.begin(), flushes.end(), unfinished);
  if (stuck != 0) {
    log::warn("ucx: {} endpoints did not flush within {} ms; closing them by force", stuck,
              close_timeout_.count());
  }
  for (void* request : flushes) ucp_request_free(request);
  for (UcxPeer& peer : peers_) close_endpoint_by_force(peer);
  // Let the transports send their disconnects before the worker goes away.
  while (ucp_worker_progress(worker_) != 0) {
  }
}

}  // namespace braid::transport::detail
