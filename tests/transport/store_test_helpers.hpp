// What the store's tests share: payloads from text, and running a coroutine on a runtime
// from the test's thread.
#pragma once

#include <string_view>
#include <utility>

#include <boost/asio/awaitable.hpp>

#include <braid/core/runtime.hpp>
#include <braid/transport/store/store.hpp>

namespace braid::transport {

inline Bytes bytes(std::string_view text) {
  return Bytes(text.begin(), text.end());
}

// Runs `work` on the runtime and waits for it; the Error it throws comes back here.
template <class T>
T run_on(Runtime& runtime, asio::awaitable<T> work) {
  return runtime.spawn(std::move(work)).get();
}

}  // namespace braid::transport
