// What a StoreClient talks to, behind its public face (StoreClient::Impl holds one): braid's own
// store over one TCP connection (store_client.cpp), or an etcd cluster through its members' JSON
// gateways (etcd_store.cpp). StoreClient prefixes the keys, hops onto the implementation's executor
// and traces each operation; an implementation carries the operation out, with the
// semantics store.hpp promises, and names itself in its errors (where()).
//
// Every member function runs on executor(), one at a time (it is never used from two
// threads at once); the awaitables may be outstanding together in any number.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <braid/core/deadline.hpp>
#include <braid/core/error.hpp>
#include <braid/transport/store/store.hpp>

namespace braid::transport {

class StoreBackend : public std::enable_shared_from_this<StoreBackend> {
 public:
  StoreBackend(asio::any_io_executor executor, std::string where)
      : executor_(std::move(executor)), where_(std::move(where)) {}
  virtual ~StoreBackend() = default;
  StoreBackend(const StoreBackend&) = delete;
  StoreBackend& operator=(const StoreBackend&) = delete;

  // Keys arrive whole (StoreAddress::key_prefix applied); `operation` ("store.get") is what
  // an error's context names. Each throws braid::Error as store.hpp describes.
  virtual asio::awaitable<void> set(std::string key, Bytes value) = 0;
  virtual asio::awaitable<Bytes> get(std::string key, Deadline deadline) = 0;
  virtual asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta) = 0;
  virtual asio::awaitable<Bytes> compare_set(std::string key, Bytes expected, Bytes desired) = 0;
  virtual asio::awaitable<std::int64_t> append(std::string key, Bytes value) = 0;
  virtual asio::awaitable<bool> erase(std::string key) = 0;
  virtual asio::awaitable<void> wait(std::vector<std::string> keys, Deadline deadline) = 0;
  virtual asio::awaitable<void> set_will(std::string key, Bytes value, bool append) = 0;
  virtual asio::awaitable<void> clear_will() = 0;

  // The client was destroyed: fails every pending and later operation with Errc::closed
  // (a will still registered fires, as it would for a process that exited).
  virtual void close() = 0;

  const asio::any_io_executor& executor() const noexcept { return executor_; }
  // "127.0.0.1:29500", "etcd://198.18.0.1:2379,198.18.0.2:2379": for messages.
  const std::string& where() const noexcept { return where_; }

  // The Errc::timeout error of an operation that waited `waited` for `awaited` ("key 'a'
  // was not set"): the same words for every implementation.
  Error timed_out(const char* operation, const std::string& awaited, Clock::duration waited) const;

 protected:
  const asio::any_io_executor executor_;
  const std::string where_;
};

// The implementations' connects: each retries until `deadline` as StoreClient::connect
// promises.
asio::awaitable<std::shared_ptr<StoreBackend>> connect_braid_store(asio::any_io_executor executor,
                                                                   const StoreAddress& address,
                                                                   Deadline deadline);
asio::awaitable<std::shared_ptr<StoreBackend>> connect_etcd_store(asio::any_io_executor executor,
                                                                  const StoreAddress& address,
                                                                  Deadline deadline);

}  // namespace braid::transport
