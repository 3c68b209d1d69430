#include "transport/store/store_keepalive.hpp"

#include <algorithm>
#include <chrono>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <braid/core/config.hpp>

namespace braid::transport::detail {

void give_up_on_silence(boost::asio::ip::tcp::socket& socket) {
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
      config::seconds_value("BRAID_NETWORK_TIMEOUT"));
  if (timeout.count() <= 0) return;  // 0: TCP's own (minutes)
  const int fd = socket.native_handle();
  const int seconds = std::max<int>(1, static_cast<int>(timeout.count() / 1000));
  // Idle for a third of the timeout, then a probe every sixth: three go unanswered before
  // the user timeout closes the connection.
  const int on = 1, idle = std::max(1, seconds / 3), interval = std::max(1, seconds / 6),
            probes = 3;
  const auto user_timeout = static_cast<unsigned>(timeout.count());
  // Best effort: a socket that refuses an option keeps TCP's defaults for it.
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

}  // namespace braid::transport::detail
