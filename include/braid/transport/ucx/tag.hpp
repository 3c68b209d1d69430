// The 64-bit UCX tag every braid point-to-point message carries, and how it is matched.
//
// Bits, most significant first:
//
//   63        52 51            32 31            12 11        0
//   +-----------+----------------+----------------+-----------+
//   | comm (12) |  source (20)   | sequence (20)  | step (12) |
//   +-----------+----------------+----------------+-----------+
//
// - comm: the communicator id. Members of a communicator agree on it; 4096 communicators
//   may be alive at once (a 3D-parallel job needs a handful per rank).
// - source: the sending rank in the transport's world (UcxWorker::rank()). The transport
//   fills it in; receives match it exactly, so each receive belongs to one peer and can be
//   failed when that peer dies. 2^20 ranks.
// - sequence: the operation's sequence number on its communicator, modulo 2^20.
// - step: the message's index within the operation (a ring step, a chunk), modulo 2^12.
//
// Wrap-around. Only the low bits of sequence and step travel. Two messages between the
// same pair of ranks can be confused only if they carry the same communicator, sequence
// and step modulo those widths while both are outstanding: 2^20 operations of one
// communicator in flight at once (each holding a buffer; collectives keep a window of a
// few), or 4096 steps of one operation outstanding between one pair of ranks. Below
// those bounds equal wire tags are never live together. Beyond them UCX's ordering still
// holds: messages with the same tag from the same sender match receives in posting
// order, so an algorithm that posts its receives from one peer in step order stays
// correct even when steps wrap.
#pragma once

#include <cstdint>

namespace braid::transport {

// What a caller says about a message; the source rank is added by the transport.
struct Tag {
  std::uint32_t communicator = 0;  // < max_communicators
  std::uint64_t sequence = 0;      // any value; the low tag_sequence_bits travel
  std::uint32_t step = 0;          // any value; the low tag_step_bits travel

  friend constexpr bool operator==(const Tag&, const Tag&) = default;
};

inline constexpr int tag_step_bits = 12;
inline constexpr int tag_sequence_bits = 20;
inline constexpr int tag_source_bits = 20;
inline constexpr int tag_communicator_bits = 12;

inline constexpr int tag_step_shift = 0;
inline constexpr int tag_sequence_shift = tag_step_shift + tag_step_bits;
inline constexpr int tag_source_shift = tag_sequence_shift + tag_sequence_bits;
inline constexpr int tag_communicator_shift = tag_source_shift + tag_source_bits;

static_assert(tag_communicator_shift + tag_communicator_bits == 64,
              "the tag fields must fill the 64-bit UCX tag exactly");

inline constexpr std::uint32_t max_communicators = std::uint32_t{1} << tag_communicator_bits;
inline constexpr std::uint32_t max_ranks = std::uint32_t{1} << tag_source_bits;

// The mask of a field `bits` wide, `shift` from the bottom.
constexpr std::uint64_t tag_field_mask(int bits, int shift) noexcept {
  return ((std::uint64_t{1} << bits) - 1) << shift;
}

// Receives match every bit: communicator, source, sequence and step.
inline constexpr std::uint64_t tag_mask_exact = ~std::uint64_t{0};

// The wire tag of `tag` sent by `source`. The communicator must be < max_communicators
// and the source < max_ranks (UcxWorker checks both); sequence and step wrap.
constexpr std::uint64_t encode_tag(const Tag& tag, std::uint32_t source) noexcept {
  return (std::uint64_t{tag.communicator} << tag_communicator_shift &
          tag_field_mask(tag_communicator_bits, tag_communicator_shift)) |
         (std::uint64_t{source} << tag_source_shift &
          tag_field_mask(tag_source_bits, tag_source_shift)) |
         (tag.sequence << tag_sequence_shift &
          tag_field_mask(tag_sequence_bits, tag_sequence_shift)) |
         (std::uint64_t{tag.step} << tag_step_shift &
          tag_field_mask(tag_step_bits, tag_step_shift));
}

// The fields of a wire tag, as they travelled (sequence and step already wrapped).
struct WireTag {
  std::uint32_t communicator = 0;
  std::uint32_t source = 0;
  std::uint32_t sequence = 0;
  std::uint32_t step = 0;

  friend constexpr bool operator==(const WireTag&, const WireTag&) = default;
};

constexpr WireTag decode_tag(std::uint64_t wire) noexcept {
  auto field = [wire](int bits, int shift) {
    return static_cast<std::uint32_t>((wire & tag_field_mask(bits, shift)) >> shift);
  };
  return {field(tag_communicator_bits, tag_communicator_shift),
          field(tag_source_bits, tag_source_shift), field(tag_sequence_bits, tag_sequence_shift),
          field(tag_step_bits, tag_step_shift)};
}

static_assert(
    decode_tag(encode_tag({.communicator = 4095, .sequence = (1u << 20) + 5, .step = 4097},
                          max_ranks - 1)) ==
        WireTag{.communicator = 4095, .source = max_ranks - 1, .sequence = 5, .step = 1},
    "fields round-trip, and sequence and step wrap without spilling into neighbours");

}  // namespace braid::transport
