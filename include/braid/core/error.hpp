// Recoverable failures: an exception carrying a std::error_code plus the context a
// person needs to find the culprit (which rank saw it, which peer, which operation,
// which sequence number). Broken invariants use BRAID_ENFORCE instead (enforce.hpp).
//
// Foreign APIs get their own error categories next to the code that calls them:
// braid::transport::ucx_category() (UCX), braid::cuda_category() (CUDA), and the NCCL
// category with the NCCL communicator.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

namespace braid {

// braid's own failure conditions, independent of any transport.
enum class Errc {
  timeout = 1,          // a deadline passed before the operation completed
  peer_failed,          // a remote rank died or its connection broke
  size_mismatch,        // ranks disagree on a size, count or dtype
  invalid_argument,     // a caller passed something the operation cannot accept
  invalid_environment,  // a launcher or BRAID_* environment variable is missing or malformed
  protocol_error,       // a peer sent bytes that do not follow the wire protocol
  refused,              // the other side refused us (wrong token, for example)
  closed,               // the object or connection was shut down while the operation waited
  cancelled,            // the operation was cancelled by its caller
  desync,               // ranks called different collectives at the same point of a communicator
};

const std::error_category& braid_category() noexcept;
std::error_code make_error_code(Errc e) noexcept;

// Where an error happened. Fields left at their defaults are omitted from messages.
struct ErrorContext {
  int rank = -1;                          // the rank that observed the failure
  int peer = -1;                          // the remote rank involved, if any
  std::string operation;                  // e.g. "recv", "store.get", "all_reduce"
  std::optional<std::uint64_t> sequence;  // the operation's sequence number, if any
};

// Thrown by every awaitable and Future in braid for recoverable failures. what() reads
// like: "rank 0: recv (peer rank 1, seq 7): peer failed: Connection reset by remote peer
// [ucx:-25]".
class Error : public std::runtime_error {
 public:
  Error(std::error_code code, std::string detail, ErrorContext context = {});

  const std::error_code& code() const noexcept { return code_; }
  const ErrorContext& context() const noexcept { return context_; }
  // The message without the context prefix.
  const std::string& detail() const noexcept { return detail_; }

 private:
  std::error_code code_;
  std::string detail_;
  ErrorContext context_;
};

// Formats what() for an error; exposed so other exception types read the same way.
std::string format_error_message(const std::error_code& code, const std::string& detail,
                                 const ErrorContext& context);

}  // namespace braid

template <>
struct std::is_error_code_enum<braid::Errc> : std::true_type {};
