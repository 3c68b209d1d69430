// NcclCommunicator's lifetime (nccl_communicator.hpp): create() (rank 0 of the bootstrap
// communicator makes the NCCL unique id and hands it out through the World's store; the
// non-blocking initialisation is polled, so a missing member times out), destruction
// (finalize, or abort when it does not flush), abort and the errors it leaves, and split.
// The entry points and their issue order are in nccl_communicator_entry_points.cpp; the
// polling of completion and of NCCL's asynchronous errors in nccl_communicator_polling.cpp.
#include <cstring>
#include <map>
#include <mutex>

#include <boost/asio/steady_timer.hpp>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <braid/collectives/communicator.hpp>
#include <braid/collectives/nccl_communicator.hpp>
#include <braid/core/cuda_error.hpp>
#include <braid/core/cuda_support.hpp>
#include <braid/core/log.hpp>
#include <braid/core/nccl_error.hpp>
#include <braid/trace/cuda_timeline.hpp>
#include <braid/trace/span.hpp>
#include <braid/transport/world.hpp>

namespace braid::collectives {
namespace {

// How many NcclCommunicators each bootstrap communicator has made on this process: members
// create them in the same order, so (serial, count) names the same one on every rank. The
// serial, not the id: ids are reused, by other members who counted other communicators.
std::uint64_t next_generation(std::int64_t bootstrap_serial) {
  static std::mutex mutex;
  static std::map<std::int64_t, std::uint64_t> made;
  std::lock_guard lock(mutex);
  return made[bootstrap_serial]++;
}

}  // namespace

asio::awaitable<std::shared_ptr<NcclCommunicator>> NcclCommunicator::create(Communicator& bootstrap,
                                                                            int device,
                                                                            Options options) {
  const Clock::duration timeout = options.timeout.value_or(default_timeout());
  const Deadline deadline = deadline_after(timeout);
  transport::World& world = bootstrap.world();
  const std::string key = fmt::format("braid/nccl/{}/{}/unique_id", bootstrap.serial(),
                                      next_generation(bootstrap.serial()));
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) {
    BRAID_NCCL_CHECK(ncclGetUniqueId(&id));
    transport::Bytes published(sizeof(id));
    std::memcpy(published.data(), &id, sizeof(id));
    std::string set_key = key;
    co_await world.store().set(std::move(set_key), std::move(published));
  } else {
    std::string get_key = key;
    // From rank 0 of the bootstrap: if it fails or leaves first, this fails now.
    const transport::Bytes published =
        co_await world.get_from(bootstrap.world_rank(0), std::move(get_key), deadline);
    if (published.size() != sizeof(id)) {
      throw Error(Errc::protocol_error,
                  fmt::format("the NCCL unique id in the store has {} bytes, not {}",
                              published.size(), sizeof(id)),
                  {.rank = world.rank(), .operation = "NcclCommunicator::create"});
    }
    std::memcpy(&id, published.data(), sizeof(id));
  }
  ncclComm_t comm = nullptr;
  {
    const CudaDeviceGuard guard(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // returns at once; settle() polls, so a missing rank times out
    const ncclResult_t started =
        ncclCommInitRankConfig(&comm, bootstrap.size(), id, bootstrap.rank(), &config);
    if (started != ncclSuccess && started != ncclInProgress) {
      braid::detail::throw_nccl_error(started, "ncclCommInitRankConfig", __FILE__, __LINE__);
    }
  }
  std::shared_ptr<NcclCommunicator> made;
  try {
    made = std::make_shared<NcclCommunicator>(Private{}, bootstrap.runtime(), comm,
                                              bootstrap.rank(), bootstrap.size(), world.rank(),
                                              device, timeout, options.compute_stream);
  } catch (...) {
    (void)ncclCommAbort(comm);
    throw;
  }
  co_await made->settle("ncclCommInitRankConfig", deadline);
  log::debug("NCCL communicator of {} ranks ready on device {}", made->size(), device);
  co_return made;
}

NcclCommunicator::NcclCommunicator(Private, Runtime& runtime, ncclComm_t comm, int rank, int size,
                                   int world_rank, int device, Clock::duration timeout,
                                   cudaStream_t compute_stream)
    : runtime_(runtime),
      comm_(comm),
      rank_(rank),
      size_(size),
      world_rank_(world_rank),
      device_(device),
      timeout_(timeout),
      compute_stream_(compute_stream),
      stream_(device, /*priority=*/-1000),  // clamped to the device's highest priority
      track_(trace::track(fmt::format("nccl device {}", device))) {
  const CudaDeviceGuard guard(device);
  BRAID_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(std::int32_t)));
  BRAID_CUDA_CHECK(cudaMemset(barrier_word_, 0, sizeof(std::int32_t)));
  if (trace::enabled()) {
    gpu_timeline_ =
        std::make_unique<CudaTimeline>(stream_, fmt::format("nccl device {} (gpu)", device));
  }
}

NcclCommunicator::~NcclCommunicator() {
  gpu_timeline_.reset();  // records the spans that finished
  if (comm_ != nullptr) {
    const CudaDeviceGuard guard(device_);
    bool flushed = ncclCommFinalize(comm_) == ncclSuccess;
    if (!flushed) {
      // Non-blocking: finalize returns ncclInProgress and finishes in the background.
      flushed = braid::poll_with_backoff(deadline_after(timeout_), [this] {
        ncclResult_t state = ncclSuccess;
        return ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclInProgress;
      });
      ncclResult_t state = ncclInternalError;
      flushed =
          flushed && ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclSuccess;
    }
    if (flushed) {
      (void)ncclCommDestroy(comm_);
    } else {
      log::warn("NCCL communicator on device {} did not flush; aborting it", device_);
      (void)ncclCommAbort(comm_);
    }
  }
  if (barrier_word_ != nullptr) (void)cudaFree(barrier_word_);
}

void NcclCommunicator::abort(const std::string& why) {
  if (!failure_.empty()) return;
  failure_ = why;
  for (asio::steady_timer* waiting : waiting_) waiting->cancel();  // they fail as closed
  if (comm_ != nullptr) {
    const CudaDeviceGuard guard(device_);
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

Error NcclCommunicator::error(std::error_code code, std::string detail,
                              std::string_view operation) const {
  return Error(code, std::move(detail),
               {.rank = world_rank_, .operation = fmt::format("nccl {}", operation)});
}

void NcclCommunicator::check_usable(std::string_view operation) const {
  if (!failure_.empty()) {
    throw error(Errc::closed, fmt::format("the NCCL communicator was aborted: {}", failure_),
                operation);
  }
}

void NcclCommunicator::fail(std::string_view what, ncclResult_t result) {
  const char* last = comm_ != nullptr ? ncclGetLastError(comm_) : nullptr;
  std::string detail = fmt::format("{} failed: {}", what, ncclGetErrorString(result));
  if (last != nullptr && *last != '\0') detail += fmt::format(" ({})", last);
  abort(detail);
  throw error(make_nccl_error_code(result), detail, what);
}

asio::awaitable<std::shared_ptr<NcclCommunicator>> NcclCommunicator::split(int color, int key) {
  check_usable("split");
  return run_split(next_ticket_++, color, key);
}

asio::awaitable<std::shared_ptr<NcclCommunicator>> NcclCommunicator::run_split(std::uint64_t ticket,
                                                                               int color, int key) {
  const std::shared_ptr<NcclCommunicator> self = shared_from_this();
  const Deadline deadline = deadline_after(timeout_);
  co_await wait_turn(ticket, "split", deadline);
  ncclComm_t child = nullptr;
  {
    struct Turn {
      NcclCommunicator& comm;
      ~Turn() { comm.pass_turn(); }
    } turn{*this};
    check_usable("split");
    {
      const CudaDeviceGuard guard(device_);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t started =
          ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
      if (started != ncclSuccess && started != ncclInProgress) fail("ncclCommSplit", started);
    }
    std::exception_ptr failure;
    try {
      co_await settle("ncclCommSplit", deadline);
    } catch (...) {
      failure = std::current_exception();
    }
    if (failure) {
      if (child != nullptr) (void)ncclCommAbort(child);  // its set-up may still be running
      std::rethrow_exception(failure);
    }
  }
  if (color < 0 || child == nullptr) co_return nullptr;
  std::shared_ptr<NcclCommunicator> made;
  try {
    made = std::make_shared<NcclCommunicator>(Private{}, runtime_, child, -1, 0, world_rank_,
                                              device_, timeout_, compute_stream_);
  } catch (...) {
    (void)ncclCommAbort(child);
    throw;
  }
  co_await made->settle("ncclCommSplit (new communicator)", deadline);
  int child_rank = -1;
  int child_size = 0;
  BRAID_NCCL_CHECK(ncclCommUserRank(child, &child_rank));
  BRAID_NCCL_CHECK(ncclCommCount(child, &child_size));
  made->rank_ = child_rank;
  made->size_ = child_size;
  co_return made;
}

}  // namespace braid::collectives
