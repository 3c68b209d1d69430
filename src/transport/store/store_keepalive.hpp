// How a store connection notices the other end gone without a word: a node that lost power
// or its network, a link cut. A process that dies is noticed at once (its kernel closes the
// connection); a machine that vanishes says nothing, and TCP on its own would retransmit
// for about 15 minutes. So both ends of every store connection ask the kernel to give up
// after BRAID_NETWORK_TIMEOUT (10 s) without an answer: keepalive probes while the
// connection is idle, and TCP_USER_TIMEOUT for data left unacknowledged. When the server
// gives up, the client's will fires and every rank fails it by name; when a client gives
// up, its World fails rank 0 ("the store it serves stopped answering").
//
// Cost: a few keepalive packets per connection every few seconds, from the kernel; nothing
// in the processes. A network that goes silent for longer than the timeout fails the job.
#pragma once

#include <boost/asio/ip/tcp.hpp>

namespace braid::transport::detail {

void give_up_on_silence(boost::asio::ip::tcp::socket& socket);

}  // namespace braid::transport::detail
