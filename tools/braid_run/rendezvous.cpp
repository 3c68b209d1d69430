#include "rendezvous.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <poll.h>
#include <stdexcept>
#include <sys/eventfd.h>
#include <unistd.h>

#include <boost/asio/detached.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <braid/core/deadline.hpp>
#include <braid/core/error.hpp>
#include <braid/core/runtime.hpp>
#include <braid/transport/bootstrap.hpp>
#include <braid/transport/store/store.hpp>

namespace braid::launcher {
namespace {

using transport::Bytes;
using namespace std::chrono_literals;

// How long node 0 keeps serving after the job's end for the other launchers to read it.
constexpr auto kLingerAtEnd = 5s;

std::string generation_key(std::int64_t generation, std::string_view what) {
  return fmt::format("braid/run/g/{}/{}", generation, what);
}
constexpr const char* kFailuresKey = "braid/run/failures";

Bytes bytes_of(std::string_view text) {
  return Bytes(text.begin(), text.end());
}
std::string text_of(const Bytes& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

// An expected value no key ever holds: compare_set with it changes nothing and returns the
// key's value, or nothing where the key is absent (an empty expected would create it).
const Bytes kNeverStored{0xff, 'p', 'e', 'e', 'k'};

Bytes encode(const GenerationEnd& end) {
  switch (end.kind) {
    case GenerationEnd::Kind::restart:
      return bytes_of((end.counted ? "R" : "G") + end.why);
    case GenerationEnd::Kind::failed:
    case GenerationEnd::Kind::store_lost:
      return bytes_of(fmt::format("F{}:{}", end.status, end.why));
    case GenerationEnd::Kind::done:
      break;
  }
  return bytes_of("D");
}

GenerationEnd decode(const Bytes& value) {
  const std::string text = text_of(value);
  if (text.starts_with('R')) return {.kind = GenerationEnd::Kind::restart, .why = text.substr(1)};
  if (text.starts_with('G')) {
    return {.kind = GenerationEnd::Kind::restart, .why = text.substr(1), .counted = false};
  }
  if (text.starts_with('F')) {
    const auto colon = text.find(':');
    const int status = colon == std::string::npos ? 1 : std::atoi(text.c_str() + 1);
    return {.kind = GenerationEnd::Kind::failed,
            .status = status,
            .why = colon == std::string::npos ? text.substr(1) : text.substr(colon + 1)};
  }
  return {.kind = GenerationEnd::Kind::done};
}

std::string host_name() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return "?";
  return name.data();
}

}  // namespace

struct Rendezvous::Impl {
  explicit Impl(Options o) : options(std::move(o)) {}

  // The watched generation's end, as the watcher saw it: shared with the watcher coroutine,
  // which may outlive a generation (a restart replaces it) but never the client.
  struct Watched {
    std::mutex mutex;
    std::optional<GenerationEnd> end;
  };

  template <class T>
  T call(asio::awaitable<T> work) {
    return runtime.spawn(std::move(work)).get();
  }

  // A failure's end of the generation: a restart while the job has one left.
  GenerationEnd proposal(int status, std::string why) const {
    if (restarts_used < options.max_restarts) {
      return {.kind = GenerationEnd::Kind::restart, .why = std::move(why)};
    }
    return {.kind = GenerationEnd::Kind::failed, .status = status, .why = std::move(why)};
  }

  asio::awaitable<Bytes> peek(std::string key) {
    // Named, not braced temporaries: GCC 12 destroys a braced temporary passed by value to a
    // coroutine twice.
    Bytes never = kNeverStored;
    Bytes nothing;
    co_return co_await store->compare_set(std::move(key), std::move(never), std::move(nothing));
  }

  // Ends generation g with `end` unless another launcher (or a will) did first; the end
  // that stands either way.
  asio::awaitable<Bytes> end_generation(std::int64_t g, Bytes end) {
    std::string key = generation_key(g, "end");
    Bytes absent;
    co_return co_await store->compare_set(std::move(key), std::move(absent), std::move(end));
  }

  // Logs `failure` as this node's in generation g, then ends g with `proposal` unless
  // another end stood first; the end that stands.
  asio::awaitable<Bytes> end_by(std::int64_t g, std::string failure, Bytes proposal) {
    std::string log_key = kFailuresKey;
    Bytes entry =
        bytes_of(fmt::format("generation {}, node {}: {}", g, options.node_rank, failure));
    co_await store->append(std::move(log_key), std::move(entry));
    co_return co_await end_generation(g, std::move(proposal));
  }

  // The nodes (--node-rank each) that run generation g: every node of --nnodes N; under
  // --nnodes MIN:MAX, those that claimed their place before the count closed -- once all MAX
  // have, or once MIN have and --join-wait has passed since (the first launcher to see it
  // closes it for all, by compare_set). Waits for MIN nodes until BRAID_TIMEOUT; the
  // interrupt fd (a signal) ends the wait.
  asio::awaitable<std::vector<int>> settle_members(std::int64_t g) {
    std::vector<int> all;
    for (int node = 0; node < options.nnodes; ++node) all.push_back(node);
    if (options.min_nnodes >= options.nnodes) co_return all;
    const std::string joined_key = generation_key(g, "joined");
    const std::string members_key = generation_key(g, "members");
    std::string joined_log = joined_key;
    Bytes slot = bytes_of(std::to_string(options.node_rank));
    co_await store->append(std::move(joined_log), std::move(slot));
    const Deadline give_up = default_deadline();
    std::optional<Clock::time_point> enough_since;
    std::vector<int> joined;
    for (;;) {
      if (const Bytes decided = co_await peek(members_key); !decided.empty()) {
        co_return parse_members(decided);
      }
      // Read the log's entries this launcher has not seen yet.
      for (;;) {
        const Bytes entry = co_await peek(fmt::format("{}/{}", joined_key, joined.size()));
        if (entry.empty()) break;
        joined.push_back(std::atoi(text_of(entry).c_str()));
      }
      const auto now = Clock::now();
      const int count = static_cast<int>(joined.size());
      if (count >= options.min_nnodes && !enough_since) enough_since = now;
      if (count >= options.nnodes || (enough_since && now - *enough_since >= options.join_wait)) {
        std::vector<int> sorted = joined;
        std::sort(sorted.begin(), sorted.end());
        sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
        std::string key = members_key;
        Bytes absent;
        Bytes proposal = bytes_of(fmt::format("{}", fmt::join(sorted, ",")));
        co_return parse_members(
            co_await store->compare_set(std::move(key), std::move(absent), std::move(proposal)));
      }
      if (now >= give_up) {
        throw Error(Errc::timeout,
                    fmt::format("{} of the {} nodes --nnodes {}:{} needs joined within "
                                "BRAID_TIMEOUT",
                                count, options.min_nnodes, options.min_nnodes, options.nnodes),
                    {.operation = "braid-run"});
      }
      if (interrupted()) {
        throw Error(Errc::closed, "stopped by a signal while waiting for the job's nodes",
                    {.operation = "braid-run"});
      }
      // The next node's arrival, or the moment the count may close; a second at most, so
      // that a signal is noticed.
      Clock::time_point until = now + 1s;
      if (enough_since) until = std::min(until, *enough_since + options.join_wait);
      try {
        co_await store->get(fmt::format("{}/{}", joined_key, joined.size()), until);
      } catch (const Error& e) {
        if (e.code() != Errc::timeout) throw;
      }
    }
  }

  static std::vector<int> parse_members(const Bytes& value) {
    std::vector<int> nodes;
    const std::string text = text_of(value);
    for (std::size_t at = 0; at < text.size();) {
      const auto comma = text.find(',', at);
      nodes.push_back(std::atoi(text.substr(at, comma - at).c_str()));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
    return nodes;
  }

  bool interrupted() const {
    pollfd interrupt{options.interrupt_fd, POLLIN, 0};
    return options.interrupt_fd >= 0 && ::poll(&interrupt, 1, 0) > 0;
  }

  asio::awaitable<std::optional<std::int64_t>> enter(bool first) {
    std::int64_t g = first ? 0 : generation + 1;
    // The restarts failures have cost the job so far (a node taken in costs none).
    restarts_used = 0;
    for (std::int64_t before = 0; !first && before < g; ++before) {
      const GenerationEnd how = decode(co_await peek(generation_key(before, "end")));
      if (how.kind == GenerationEnd::Kind::restart && how.counted) ++restarts_used;
    }
    if (first) {
      // The job's current generation: the first without an end.
      for (;; ++g) {
        const Bytes end = co_await peek(generation_key(g, "end"));
        if (end.empty()) break;
        const GenerationEnd how = decode(end);
        if (how.kind != GenerationEnd::Kind::restart) {
          found_ended = true;
          record(how);
          co_return std::nullopt;
        }
        if (how.counted) ++restarts_used;
      }
    }
    for (;; ++g) {
      generation = g;
      std::string node_key = generation_key(g, fmt::format("node/{}", options.node_rank));
      Bytes absent;
      Bytes mine = bytes_of(self);
      const Bytes claimed =
          co_await store->compare_set(std::move(node_key), std::move(absent), std::move(mine));
      GenerationEnd end;
      if (text_of(claimed) != self) {
        // Another braid-run ran this node's ranks in g: this one replaces it, so g is over.
        end = proposal(1, fmt::format("node {}'s braid-run ({}) is gone: {} took its place",
                                      options.node_rank, text_of(claimed), self));
      } else {
        members = co_await settle_members(g);
        if (std::find(members.begin(), members.end(), options.node_rank) != members.end()) break;
        // Counted out: the others started without this node. It joins the next start, which
        // it asks for now, as torchrun's agents restart for a node waiting; a membership
        // change, not a failure, so no restart of --max-restarts is spent on it.
        end = {.kind = GenerationEnd::Kind::restart,
               .why = fmt::format("node {} joined the job, which restarts to take it in",
                                  options.node_rank),
               .counted = false};
      }
      const GenerationEnd how = decode(co_await end_by(g, end.why, encode(end)));
      if (how.kind != GenerationEnd::Kind::restart) {
        record(how);
        co_return std::nullopt;
      }
      if (how.counted) ++restarts_used;
    }
    // This launcher's connection dropping (its node gone) ends g for everyone.
    const GenerationEnd will =
        proposal(1, fmt::format("node {}'s braid-run ({}) lost its connection to the store",
                                options.node_rank, self));
    std::string end_key = generation_key(g, "end");
    Bytes will_value = encode(will);
    co_await store->set_will(std::move(end_key), std::move(will_value));
    watched = std::make_shared<Watched>();
    std::string watched_key = generation_key(g, "end");
    asio::co_spawn(runtime.executor(), watch(store.get(), std::move(watched_key), watched, wakeup),
                   asio::detached);
    co_return g;
  }

  // Waits for the end of a generation and rings `wakeup`. A lost store is an end too.
  static asio::awaitable<void> watch(transport::StoreClient* store, std::string key,
                                     std::shared_ptr<Watched> watched, int wakeup) {
    GenerationEnd end;
    for (;;) {
      try {
        std::string end_key = key;
        end = decode(co_await store->get(std::move(end_key), default_deadline()));
        break;
      } catch (const Error& e) {
        if (e.code() == Errc::timeout) continue;
        if (e.code() == Errc::closed) co_return;  // this braid-run is leaving
        end = {.kind = GenerationEnd::Kind::store_lost, .status = 1, .why = e.what()};
        break;
      }
    }
    {
      std::lock_guard lock(watched->mutex);
      watched->end = std::move(end);
    }
    const std::uint64_t one = 1;
    ssize_t ignored = ::write(wakeup, &one, sizeof one);
    static_cast<void>(ignored);
  }

  void record(GenerationEnd how) {
    watched = std::make_shared<Watched>();
    watched->end = std::move(how);
  }

  Options options;
  std::string self = fmt::format("{}:{}", host_name(), ::getpid());
  Runtime runtime{Runtime::Options{.thread_name = "braid-run-store"}};
  std::unique_ptr<transport::StoreServer> server;
  std::unique_ptr<transport::StoreClient> store;
  std::uint16_t port = 0;  // where the store listens
  std::string where;       // Rendezvous::where()
  bool found_ended = false;
  std::optional<std::string> not_joined;  // why this node takes no part (enter())
  int restarts_used = 0;     // restarts failures cost the job before the generation entered last
  std::vector<int> members;  // the nodes of the generation entered last
  int wakeup = -1;
  std::int64_t generation = -1;
  std::shared_ptr<Watched> watched;
};

Rendezvous::Rendezvous(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {
  Impl& impl = *impl_;
  impl.wakeup = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl.wakeup < 0) throw std::runtime_error("cannot make an eventfd for the store's news");
  std::uint16_t port = impl.options.port;
  const bool etcd = !impl.options.etcd_members.empty();
  try {
    if (impl.options.serve && !etcd) {
      impl.server = std::make_unique<transport::StoreServer>(
          impl.runtime,
          transport::StoreServer::Options{
              .host = "0.0.0.0", .port = impl.options.port, .token = impl.options.token});
      port = impl.server->port();
    }
    impl.port = port;
    transport::StoreAddress address{
        .host = impl.options.host, .port = port, .token = impl.options.token};
    impl.where = fmt::format("node 0 ({})", transport::format_host_port(impl.options.host, port));
    if (etcd) {
      address.etcd_members = impl.options.etcd_members;
      address.etcd_namespace = impl.options.etcd_namespace;
      impl.where =
          transport::format_etcd_url({impl.options.etcd_members, impl.options.etcd_namespace});
    }
    Future<std::unique_ptr<transport::StoreClient>> connecting =
        impl.runtime.spawn(transport::StoreClient::connect(impl.runtime.executor(),
                                                           std::move(address), default_deadline()));
    // Node 0 may take minutes to come up (BRAID_TIMEOUT); a Ctrl-C meanwhile ends the wait.
    while (!connecting.wait_for(std::chrono::milliseconds(100))) {
      pollfd interrupt{impl.options.interrupt_fd, POLLIN, 0};
      if (impl.options.interrupt_fd >= 0 && ::poll(&interrupt, 1, 0) > 0) {
        throw std::runtime_error(
            fmt::format("stopped by a signal while waiting for the job's store on {}", impl.where));
      }
    }
    impl.store = connecting.get();
  } catch (const Error& e) {
    throw std::runtime_error(
        impl.options.serve && !etcd
            ? fmt::format("cannot serve the job's store on port {}: {}", impl.options.port,
                          e.what())
            : fmt::format("cannot reach the job's store on {}: {}", impl.where, e.what()));
  }
}

Rendezvous::~Rendezvous() {
  // The client before the server, both on the runtime's thread's terms: destroying the
  // client fails the watcher's get with Errc::closed, which it leaves quietly.
  impl_->runtime.run([&] { impl_->store.reset(); });
  impl_->server.reset();
  ::close(impl_->wakeup);
}

std::optional<std::int64_t> Rendezvous::enter() {
  const bool first = impl_->generation < 0;
  try {
    return impl_->call(impl_->enter(first));
  } catch (const Error& e) {
    if (e.context().operation == "braid-run") {  // settle_members: too few nodes, a signal
      impl_->not_joined = e.detail();
      return std::nullopt;
    }
    impl_->record({.kind = GenerationEnd::Kind::store_lost, .status = 1, .why = e.what()});
    return std::nullopt;
  }
}

std::string Rendezvous::key_prefix(std::int64_t generation) {
  return generation_key(generation, "");
}

std::uint16_t Rendezvous::port() const {
  return impl_->port;
}

const std::string& Rendezvous::where() const {
  return impl_->where;
}

bool Rendezvous::found_ended() const {
  return impl_->found_ended;
}

const std::optional<std::string>& Rendezvous::not_joined() const {
  return impl_->not_joined;
}

const std::vector<int>& Rendezvous::members() const {
  return impl_->members;
}

int Rendezvous::restarts_used() const {
  return impl_->restarts_used;
}

int Rendezvous::wakeup_fd() const {
  return impl_->wakeup;
}

void Rendezvous::clear_wakeup() {
  std::uint64_t rings = 0;
  ssize_t ignored = ::read(impl_->wakeup, &rings, sizeof rings);
  static_cast<void>(ignored);
}

std::optional<GenerationEnd> Rendezvous::ended() const {
  if (!impl_->watched) return std::nullopt;
  std::lock_guard lock(impl_->watched->mutex);
  return impl_->watched->end;
}

GenerationEnd Rendezvous::end_by_failure(int status, const std::string& failure, bool may_restart) {
  Impl& impl = *impl_;
  const std::int64_t g = impl.generation;
  try {
    std::string why = fmt::format("node {}: {}", impl.options.node_rank, failure);
    const Bytes proposal = encode(may_restart ? impl.proposal(status, std::move(why))
                                              : GenerationEnd{.kind = GenerationEnd::Kind::failed,
                                                              .status = status,
                                                              .why = std::move(why)});
    const Bytes stored = impl.call(impl.end_by(g, failure, proposal));
    GenerationEnd end = decode(stored);
    end.ours = stored == proposal;
    return end;
  } catch (const Error& e) {
    return {.kind = GenerationEnd::Kind::store_lost, .status = status, .why = e.what()};
  }
}

void Rendezvous::finished() {
  Impl& impl = *impl_;
  const std::int64_t g = impl.generation;
  try {
    const std::int64_t count = impl.call(impl.store->add(generation_key(g, "finished"), 1));
    if (count == static_cast<std::int64_t>(impl.members.size())) {
      impl.call(impl.end_generation(g, encode({})));
    }
  } catch (const Error&) {
    // The watcher sees the store's loss too and reports it.
  }
}

std::vector<std::string> Rendezvous::failures() {
  Impl& impl = *impl_;
  std::vector<std::string> log;
  try {
    const Bytes count = impl.call(impl.peek(kFailuresKey));
    const int n = count.empty() ? 0 : std::atoi(text_of(count).c_str());
    for (int i = 0; i < n; ++i) {
      log.push_back(text_of(impl.call(impl.peek(fmt::format("{}/{}", kFailuresKey, i)))));
    }
  } catch (const Error&) {
    // What the store had is lost with it.
  }
  return log;
}

void Rendezvous::leave() {
  Impl& impl = *impl_;
  const std::int64_t g = impl.generation;
  if (g < 0) return;
  try {
    const std::int64_t read = impl.call(impl.store->add(generation_key(g, "read"), 1));
    if (read == static_cast<std::int64_t>(impl.members.size())) {
      transport::Bytes nothing;  // named: GCC 12 destroys a braced temporary given to a
                                 // coroutine twice
      impl.call(impl.store->set(generation_key(g, "all-read"), std::move(nothing)));
    }
    impl.call(impl.store->clear_will());
    if (impl.server && impl.members.size() > 1) {
      impl.call(impl.store->get(generation_key(g, "all-read"), deadline_after(kLingerAtEnd)));
    }
  } catch (const Error&) {
    // A launcher that never reads it is gone: nobody is left to tell.
  }
}

}  // namespace braid::launcher
