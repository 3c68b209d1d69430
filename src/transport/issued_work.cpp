// The encoding: u32 communicators, then per communicator u32 id, u64 first sequence, u64
// issued, u32 peers, then per peer u32 world rank, u64 sent, u64 received.
#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/transport/issued_work.hpp>

namespace braid::transport {
namespace {

void put(Bytes& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
}

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
  std::uint64_t take(int bytes) {
    if (bytes_.size() - at_ < static_cast<std::size_t>(bytes)) {
      throw Error(
          Errc::protocol_error,
          fmt::format("issued work ends after {} of its {} bytes are read", at_, bytes_.size()),
          {.operation = "World::leave"});
    }
    std::uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) value |= std::uint64_t{bytes_[at_++]} << (8 * i);
    return value;
  }
  // How many entries of `entry_bytes` each could still follow: a count larger than that is
  // refused before anything is reserved for it.
  std::uint32_t count(std::size_t entry_bytes) {
    const auto n = static_cast<std::uint32_t>(take(4));
    if (n > (bytes_.size() - at_) / entry_bytes) {
      throw Error(
          Errc::protocol_error,
          fmt::format("issued work announces {} entries in {} bytes", n, bytes_.size() - at_),
          {.operation = "World::leave"});
    }
    return n;
  }
  bool done() const noexcept { return at_ == bytes_.size(); }

 private:
  std::span<const std::uint8_t> bytes_;
  std::size_t at_ = 0;
};

constexpr std::size_t kCommunicatorBytes = 4 + 8 + 8 + 4;
constexpr std::size_t kPeerBytes = 4 + 8 + 8;

}  // namespace

Bytes encode_issued_work(const IssuedWork& work) {
  Bytes out;
  put(out, work.size(), 4);
  for (const CommunicatorWork& c : work) {
    put(out, c.communicator, 4);
    put(out, c.first_sequence, 8);
    put(out, c.issued, 8);
    put(out, c.point_to_point.size(), 4);
    for (const PeerMessages& p : c.point_to_point) {
      put(out, static_cast<std::uint32_t>(p.world_rank), 4);
      put(out, p.sent, 8);
      put(out, p.received, 8);
    }
  }
  return out;
}

IssuedWork decode_issued_work(std::span<const std::uint8_t> bytes) {
  Reader in(bytes);
  IssuedWork work(in.count(kCommunicatorBytes));
  for (CommunicatorWork& c : work) {
    c.communicator = static_cast<std::uint32_t>(in.take(4));
    c.first_sequence = in.take(8);
    c.issued = in.take(8);
    c.point_to_point.resize(in.count(kPeerBytes));
    for (PeerMessages& p : c.point_to_point) {
      p.world_rank = static_cast<int>(static_cast<std::uint32_t>(in.take(4)));
      p.sent = in.take(8);
      p.received = in.take(8);
    }
  }
  if (!in.done()) {
    throw Error(Errc::protocol_error, "issued work is followed by bytes that belong to none of it",
                {.operation = "World::leave"});
  }
  return work;
}

}  // namespace braid::transport
