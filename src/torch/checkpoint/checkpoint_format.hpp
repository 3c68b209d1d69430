// The bytes of one rank's checkpoint, the same on disk (DiskCheckpoints' files) and in
// memory (MemoryCheckpoints' slots), so a slot can be written to disk as it is:
//
//   "BRAIDCK1" | i64 step | u32 rank | u32 world | u32 entries |
//   entry: u8 kind (0 tensor, 1 blob) | u32 name length | name |
//     tensor: i32 scalar type | u32 dims | i64 dims... | u64 bytes | bytes
//     blob:   u64 bytes | bytes
//   | u64 checksum of everything before it
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <braid/torch/checkpoint/disk_checkpoints.hpp>

namespace braid::torch::checkpoint_format {

// FNV-1a over 8-byte words (and the tail bytewise), fed in pieces of any size: fast enough
// to run at memory speed, and any torn or flipped byte changes it. Not a defence against
// tampering.
class Checksum {
 public:
  void add(const char* data, std::size_t size);
  std::uint64_t value() const;

 private:
  void word(const char* bytes);
  std::uint64_t hash_ = 0xcbf29ce484222325ULL;
  std::array<char, 8> carry_{};
  std::size_t carried_ = 0;
};

// Hands the encoding to `write` in pieces: the small ones (headers) gathered in a buffer,
// the tensors' bytes straight from their memory, so the state is never copied into one
// string. Checksums all of it.
class Encoder {
 public:
  // With `checksummed` false no checksum is computed and its 8 bytes are written as 0 (for
  // a copy checked otherwise).
  explicit Encoder(std::function<void(const char*, std::size_t)> write, bool checksummed = true)
      : write_(std::move(write)), checksummed_(checksummed) {}
  void small(std::string_view bytes);
  void large(const char* data, std::size_t size);
  void flush();
  const Checksum& checksum() const { return checksum_; }
  bool checksummed() const { return checksummed_; }

 private:
  void raw(const char* data, std::size_t size);
  std::function<void(const char*, std::size_t)> write_;
  bool checksummed_;
  std::string buffer_;
  Checksum checksum_;
};

// Writes `state` as rank `rank` of `world`. A tensor off the CPU or not contiguous is
// copied to a contiguous host tensor first.
void encode(Encoder& out, const TrainingState& state, int rank, int world);

// The bytes encode() writes for `state`.
std::size_t encoded_size(const TrainingState& state);

// Reads what encode() wrote for rank `rank` of `world`; std::runtime_error saying what is
// wrong with it (torn, damaged, another rank's). With `verify` false the checksum is not
// checked (an encoding not sealed yet).
TrainingState decode(std::string_view bytes, int rank, int world, bool verify = true);

}  // namespace braid::torch::checkpoint_format
