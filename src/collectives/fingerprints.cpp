// Fingerprints (fingerprints.hpp): what a call's fingerprint holds, how it reads in an
// error, and its exchange before the algorithm under BRAID_DEBUG=detail.
#include "collectives/fingerprints.hpp"

#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>

#include "collectives/collective_op.hpp"

namespace braid::collectives::detail {

namespace {

std::uint64_t hash_counts(std::span<const std::size_t> counts) {
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (std::size_t count : counts) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (static_cast<std::uint64_t>(count) >> (8 * byte)) & 0xff;
      hash *= 1099511628211ull;
    }
  }
  return hash;
}

bool is_reduction(CollectiveKind kind) {
  return kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter ||
         kind == CollectiveKind::reduce;
}

}  // namespace

bool fingerprints_from_environment() {
  const std::string value = config::string_value("BRAID_DEBUG");
  if (value == "detail") return true;
  if (value == "off" || value.empty()) return false;
  throw Error(Errc::invalid_environment,
              fmt::format("BRAID_DEBUG='{}': expected off or detail", value),
              {.operation = "collectives"});
}

asio::awaitable<void> exchange_fingerprints(CollectiveOp& op, const CollectiveCall& call,
                                            std::uint32_t communicator) {
  const Fingerprint mine = fingerprint_of(call);
  std::vector<Fingerprint> theirs(static_cast<std::size_t>(op.size()));
  std::vector<Message> messages;
  for (int peer = 0; peer < op.size(); ++peer) {
    if (peer == op.rank()) continue;
    const Buffer into(&theirs[static_cast<std::size_t>(peer)], sizeof(Fingerprint), DType::u8);
    messages.push_back(op.recv_reserved(peer, into, kFingerprintStep, true));
  }
  Fingerprint sent = mine;
  for (int peer = 0; peer < op.size(); ++peer) {
    if (peer == op.rank()) continue;
    const Buffer from(&sent, sizeof(Fingerprint), DType::u8);
    messages.push_back(op.send_reserved(peer, from, kFingerprintStep));
  }
  co_await op.wait_all(messages);
  for (int peer = 0; peer < op.size(); ++peer) {
    if (peer == op.rank()) continue;
    const Fingerprint& other = theirs[static_cast<std::size_t>(peer)];
    if (other == mine) continue;
    throw Error(Errc::desync,
                fmt::format("at sequence {} of communicator {}, this rank called {} and rank {} "
                            "called {}",
                            call.sequence, communicator, describe(mine), op.world_rank(peer),
                            describe(other)),
                {.rank = op.world_rank(op.rank()), .peer = op.world_rank(peer)});
  }
}

Fingerprint fingerprint_of(const CollectiveCall& call) {
  Fingerprint f;
  f.kind = static_cast<std::uint8_t>(call.kind);
  f.variable = call.variable ? 1 : 0;
  f.staged = call.staged ? 1 : 0;
  f.sequence = call.sequence;
  if (call.kind == CollectiveKind::barrier) return f;
  // The buffer every rank passes (non-roots' outputs of reduce and gather, and their
  // inputs of scatter, are empty).
  const bool output_typed =
      call.kind == CollectiveKind::scatter || call.kind == CollectiveKind::broadcast;
  const Buffer& typed = output_typed ? call.output : call.input;
  f.dtype = static_cast<std::uint8_t>(typed.dtype());
  f.reduce_op = is_reduction(call.kind) ? static_cast<std::uint8_t>(call.reduce_op) : 0xff;
  f.root = is_rooted(call.kind) ? call.root : -1;
  switch (call.kind) {
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::scatter:
      f.count = call.output.count();
      break;
    case CollectiveKind::broadcast:
      f.count = call.output.count();
      break;
    default:
      f.count = call.variable ? 0 : call.input.count();
  }
  if (call.kind == CollectiveKind::all_gather && call.variable)
    f.counts_hash = hash_counts(call.counts);
  return f;
}

std::string describe(const Fingerprint& f) {
  const auto kind = static_cast<CollectiveKind>(f.kind);
  std::string text = fmt::format("{}{}(", to_string(kind), f.variable ? "_v" : "");
  if (kind == CollectiveKind::barrier) return text + ")";
  if (f.variable) {
    text += kind == CollectiveKind::all_gather ? fmt::format("counts #{:016x}", f.counts_hash)
                                               : std::string("variable counts");
  } else {
    text += fmt::format("count {}", f.count);
  }
  text += fmt::format(", {}", to_string(static_cast<DType>(f.dtype)));
  if (f.reduce_op != 0xff)
    text += fmt::format(", {}", to_string(static_cast<ReduceOp>(f.reduce_op)));
  if (f.root >= 0) text += fmt::format(", root {}", f.root);
  if (f.staged != 0) text += ", CUDA memory staged through the host";
  return text + ")";
}

}  // namespace braid::collectives::detail
