#include <string>
#include <vector>

#include <fmt/format.h>

#include <braid/core/enforce.hpp>
#include <braid/core/error.hpp>
#include <braid/core/log.hpp>
#include <braid/transport/world.hpp>

namespace braid::transport {
namespace {

std::string address_key(int rank) {
  return fmt::format("braid/world/ucx_address/{}", rank);
}
std::string left_key(int rank) {
  return fmt::format("braid/world/left/{}", rank);
}

// Listen on every interface of the store host's family, so ranks on other nodes reach it.
std::string listen_host_for(const std::string& store_host) {
  return store_host.find(':') != std::string::npos ? "::" : "0.0.0.0";
}

}  // namespace

World::World(Runtime& runtime, LaunchInfo launch, Options options)
    : runtime_(runtime), launch_(std::move(launch)), options_(std::move(options)) {}

std::unique_ptr<World> World::join(Runtime& runtime, const LaunchInfo& launch, Options options) {
  BRAID_ENFORCE(!runtime.on_runtime_thread(),
                "World::join blocks; call it from another thread or co_await async_join");
  return runtime.spawn(async_join(runtime, launch, std::move(options))).get();
}

asio::awaitable<std::unique_ptr<World>> World::async_join(Runtime& runtime, LaunchInfo launch,
                                                          Options options) {
  log::set_process_rank(launch.rank);
  const Deadline deadline = deadline_after(options.join_timeout.value_or(default_timeout()));
  std::unique_ptr<World> world(new World(runtime, std::move(launch), std::move(options)));
  const LaunchInfo& info = world->launch_;

  std::uint16_t store_port = info.store_port;
  if (info.rank == 0) {
    world->server_ = std::make_unique<StoreServer>(
        runtime, StoreServer::Options{.host = listen_host_for(info.store_host),
                                      .port = info.store_port,
                                      .token = info.token});
    store_port = world->server_->port();
    log::debug("serving the store on port {}", store_port);
  }
  // A named argument, not a braced temporary: GCC 12 destroys a braced temporary passed
  // by value to a coroutine twice.
  StoreAddress store_address{.host = info.store_host, .port = store_port, .token = info.token};
  world->store_ =
      co_await StoreClient::connect(runtime.executor(), std::move(store_address), deadline);

  world->ucx_ = std::make_unique<UcxWorker>(runtime, world->options_.ucx);
  co_await world->store_->set(address_key(info.rank), world->ucx_->address());
  std::vector<Bytes> addresses(static_cast<std::size_t>(info.world_size));
  for (int r = 0; r < info.world_size; ++r) {
    addresses[static_cast<std::size_t>(r)] = co_await world->store_->get(address_key(r), deadline);
  }
  world->ucx_->connect(addresses, info.rank);
  log::info("joined a world of {} rank(s) (launched by {}, store {})", info.world_size, info.source,
            format_host_port(info.store_host, store_port));
  co_return world;
}

asio::awaitable<void> World::leave() {
  const Deadline deadline = deadline_after(options_.leave_timeout);
  co_await store_->set(left_key(rank()), {});
  if (rank() != 0) co_return;
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(left_key(r));
  co_await store_->wait(std::move(keys), deadline);
}

World::~World() {
  // Only when the world finished joining (a failed join never reaches here) and we are
  // not on the runtime thread, where waiting would deadlock.
  if (store_ && !runtime_.on_runtime_thread()) {
    try {
      runtime_.spawn(leave()).get();
    } catch (const std::exception& e) {
      log::warn("leaving the world: {}", e.what());
    }
  }
  // Destroy in reverse order of use: endpoints first, then the store client, then the
  // server other ranks may have been reading from until the leave barrier.
  ucx_.reset();
  store_.reset();
  server_.reset();
}

Tag World::world_tag(std::uint64_t tag) noexcept {
  return Tag{.communicator = 0,
             .sequence = tag >> tag_step_bits,
             .step = static_cast<std::uint32_t>(tag & ((std::uint64_t{1} << tag_step_bits) - 1))};
}

asio::awaitable<void> World::send(int peer, Buffer buffer, std::uint64_t tag, Deadline deadline) {
  co_await ucx_->send(peer, buffer, world_tag(tag), deadline);
}

asio::awaitable<std::size_t> World::recv(int peer, Buffer buffer, std::uint64_t tag,
                                         Deadline deadline) {
  co_return co_await ucx_->recv(peer, buffer, world_tag(tag), deadline);
}

}  // namespace braid::transport
