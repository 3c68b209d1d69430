#include "checkpoint_format.hpp"

#include <cstring>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

namespace braid::torch::checkpoint_format {
namespace {

constexpr char kMagic[8] = {'B', 'R', 'A', 'I', 'D', 'C', 'K', '1'};
constexpr std::uint64_t kPrime = 0x100000001b3ULL;

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

std::string head_of(const TrainingState& state, int rank, int world) {
  std::string head(kMagic, sizeof kMagic);
  put<std::int64_t>(head, state.step);
  put<std::uint32_t>(head, static_cast<std::uint32_t>(rank));
  put<std::uint32_t>(head, static_cast<std::uint32_t>(world));
  put<std::uint32_t>(head, static_cast<std::uint32_t>(state.tensors.size() + state.blobs.size()));
  return head;
}

std::string tensor_entry(const std::string& name, const at::Tensor& tensor) {
  std::string entry;
  put<std::uint8_t>(entry, 0);
  put<std::uint32_t>(entry, static_cast<std::uint32_t>(name.size()));
  entry.append(name);
  put<std::int32_t>(entry, static_cast<std::int32_t>(tensor.scalar_type()));
  put<std::uint32_t>(entry, static_cast<std::uint32_t>(tensor.dim()));
  for (std::int64_t d : tensor.sizes()) put<std::int64_t>(entry, d);
  put<std::uint64_t>(entry, tensor.nbytes());
  return entry;
}

std::string blob_entry(const std::string& name, const std::string& bytes) {
  std::string entry;
  put<std::uint8_t>(entry, 1);
  put<std::uint32_t>(entry, static_cast<std::uint32_t>(name.size()));
  entry.append(name);
  put<std::uint64_t>(entry, bytes.size());
  return entry;
}

class Decoder {
 public:
  explicit Decoder(std::string_view bytes) : bytes_(bytes) {}

  template <class T>
  T get() {
    T value;
    std::memcpy(&value, take(sizeof value).data(), sizeof value);
    return value;
  }
  std::string_view take(std::size_t n) {
    if (n > bytes_.size() - at_) throw std::runtime_error("it ends early");
    auto piece = bytes_.substr(at_, n);
    at_ += n;
    return piece;
  }
  bool done() const { return at_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  std::size_t at_ = 0;
};

}  // namespace

void Checksum::add(const char* data, std::size_t size) {
  while (size > 0 && carried_ > 0) {  // finish the word a previous piece began
    carry_[carried_++] = *data++;
    --size;
    if (carried_ == 8) {
      word(carry_.data());
      carried_ = 0;
    }
  }
  for (; size >= 8; data += 8, size -= 8) word(data);
  for (; size > 0; --size) carry_[carried_++] = *data++;
}

std::uint64_t Checksum::value() const {
  std::uint64_t hash = hash_;
  for (std::size_t i = 0; i < carried_; ++i) {
    hash = (hash ^ static_cast<unsigned char>(carry_[i])) * kPrime;
  }
  return hash;
}

void Checksum::word(const char* bytes) {
  std::uint64_t w;
  std::memcpy(&w, bytes, 8);
  hash_ = (hash_ ^ w) * kPrime;
}

void Encoder::small(std::string_view bytes) {
  constexpr std::size_t kBuffer = 64 << 10;
  buffer_.append(bytes);
  if (buffer_.size() >= kBuffer) flush();
}

void Encoder::large(const char* data, std::size_t size) {
  flush();
  raw(data, size);
}

void Encoder::flush() {
  raw(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void Encoder::raw(const char* data, std::size_t size) {
  if (size == 0) return;
  if (checksummed_) checksum_.add(data, size);
  write_(data, size);
}

void encode(Encoder& out, const TrainingState& state, int rank, int world) {
  out.small(head_of(state, rank, world));
  for (const auto& [name, tensor] : state.tensors) {
    out.small(tensor_entry(name, tensor));
    const at::Tensor host = tensor.device().is_cpu() && tensor.is_contiguous()
                                ? tensor
                                : tensor.detach().to(at::kCPU).contiguous();
    out.large(static_cast<const char*>(host.const_data_ptr()), host.nbytes());
  }
  for (const auto& [name, bytes] : state.blobs) {
    out.small(blob_entry(name, bytes));
    out.large(bytes.data(), bytes.size());
  }
  out.flush();
  std::string tail;
  put<std::uint64_t>(tail, out.checksummed() ? out.checksum().value() : 0);
  out.large(tail.data(), tail.size());
}

std::size_t encoded_size(const TrainingState& state) {
  std::size_t size = head_of(state, 0, 0).size() + sizeof(std::uint64_t);
  for (const auto& [name, tensor] : state.tensors) {
    size += tensor_entry(name, tensor).size() + tensor.nbytes();
  }
  for (const auto& [name, bytes] : state.blobs)
    size += blob_entry(name, bytes).size() + bytes.size();
  return size;
}

TrainingState decode(std::string_view bytes, int rank, int world, bool verify) {
  if (bytes.size() < sizeof kMagic + 8 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    throw std::runtime_error("it is not a braid checkpoint (no BRAIDCK1 header)");
  }
  const std::string_view body = bytes.substr(0, bytes.size() - 8);
  std::uint64_t stored;
  std::memcpy(&stored, bytes.data() + body.size(), 8);
  Checksum computed;
  if (verify) computed.add(body.data(), body.size());
  if (verify && computed.value() != stored) {
    throw std::runtime_error("its checksum does not match its contents (torn or damaged)");
  }
  Decoder in(body.substr(sizeof kMagic));
  TrainingState state;
  state.step = in.get<std::int64_t>();
  const auto file_rank = in.get<std::uint32_t>();
  const auto file_world = in.get<std::uint32_t>();
  if (static_cast<int>(file_rank) != rank || static_cast<int>(file_world) != world) {
    throw std::runtime_error(fmt::format("it is rank {} of {}'s, not rank {} of {}'s", file_rank,
                                         file_world, rank, world));
  }
  const auto entries = in.get<std::uint32_t>();
  for (std::uint32_t e = 0; e < entries; ++e) {
    const auto kind = in.get<std::uint8_t>();
    std::string name(in.take(in.get<std::uint32_t>()));
    if (kind == 1) {
      state.blobs[name] = std::string(in.take(in.get<std::uint64_t>()));
      continue;
    }
    if (kind != 0) throw std::runtime_error(fmt::format("entry '{}' has kind {}", name, kind));
    const auto type = static_cast<c10::ScalarType>(in.get<std::int32_t>());
    std::vector<std::int64_t> sizes(in.get<std::uint32_t>());
    for (auto& d : sizes) d = in.get<std::int64_t>();
    const std::string_view data = in.take(in.get<std::uint64_t>());
    at::Tensor tensor = at::empty(sizes, at::TensorOptions().dtype(type));
    if (tensor.nbytes() != data.size()) {
      throw std::runtime_error(fmt::format("tensor '{}' holds {} bytes for its shape's {}", name,
                                           data.size(), tensor.nbytes()));
    }
    std::memcpy(tensor.mutable_data_ptr(), data.data(), data.size());
    state.tensors[name] = std::move(tensor);
  }
  if (!in.done()) throw std::runtime_error("bytes follow its last entry");
  return state;
}

}  // namespace braid::torch::checkpoint_format
