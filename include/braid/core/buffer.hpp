// A Buffer is a non-owning view of typed memory: host or CUDA. The caller keeps the
// memory alive and unmodified until every operation using the Buffer has completed.
//
// A CUDA buffer may name the stream whose work writes and reads it (on_stream): a
// collective on it then follows that stream (its copies or kernels start after the work
// enqueued there before the call) instead of the communicator's default producer stream.
// Why per buffer: the data-parallel reducer's buckets are written on a stream of their
// own, while other calls on the same communicator follow the training loop's stream; a
// communicator-wide setting would make one of them wait for the other's later work.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include <braid/core/dtype.hpp>
#include <braid/core/enforce.hpp>

namespace braid {

class Stream;

enum class MemoryKind : std::uint8_t { host, cuda };

constexpr std::string_view to_string(MemoryKind kind) noexcept {
  return kind == MemoryKind::host ? "host" : "cuda";
}

class Buffer {
 public:
  Buffer() = default;
  // `device` is the CUDA device ordinal for cuda memory, -1 for host memory.
  Buffer(void* data, std::size_t count, DType dtype, MemoryKind memory = MemoryKind::host,
         int device = -1)
      : data_(data), count_(count), dtype_(dtype), memory_(memory), device_(device) {
    BRAID_ENFORCE(data != nullptr || count == 0, "a Buffer of {} elements needs memory", count);
    BRAID_ENFORCE((memory == MemoryKind::cuda) == (device >= 0),
                  "cuda memory needs a device ordinal and host memory must not have one "
                  "(memory {}, device {})",
                  to_string(memory), device);
  }

  template <class T>
  requires requires { DTypeOf<std::remove_const_t<T>>::value; }
  explicit Buffer(std::span<T> elements)
      : Buffer(const_cast<std::remove_const_t<T>*>(elements.data()), elements.size(),
               dtype_of<std::remove_const_t<T>>) {}

  template <class T>
  requires requires { DTypeOf<T>::value; }
  explicit Buffer(std::vector<T>& elements) : Buffer(std::span<T>(elements)) {}

  void* data() const noexcept { return data_; }
  std::size_t count() const noexcept { return count_; }
  DType dtype() const noexcept { return dtype_; }
  MemoryKind memory() const noexcept { return memory_; }
  int device() const noexcept { return device_; }
  std::size_t size_bytes() const noexcept { return count_ * dtype_size(dtype_); }
  bool empty() const noexcept { return count_ == 0; }
  // The stream this buffer's work is ordered on; null: the communicator's default.
  Stream* stream() const noexcept { return stream_; }
  // This view, ordered on `stream` (not owned: it must outlive every call on the view).
  Buffer on_stream(Stream* stream) const noexcept {
    Buffer ordered = *this;
    ordered.stream_ = stream;
    return ordered;
  }

  // Elements [offset, offset + count) of this buffer.
  Buffer slice(std::size_t offset, std::size_t count) const {
    BRAID_ENFORCE(offset <= count_ && count <= count_ - offset,
                  "slice [{}, {}) is outside a buffer of {} elements", offset, offset + count,
                  count_);
    return Buffer(static_cast<std::byte*>(data_) + offset * dtype_size(dtype_), count, dtype_,
                  memory_, device_)
        .on_stream(stream_);
  }

  // Typed access to host memory.
  template <class T>
  std::span<T> as() const {
    BRAID_ENFORCE(memory_ == MemoryKind::host, "as<T>() needs host memory, this is {}",
                  to_string(memory_));
    BRAID_ENFORCE(dtype_of<std::remove_const_t<T>> == dtype_, "as<T>() asked for {} of a {} buffer",
                  to_string(dtype_of<std::remove_const_t<T>>), to_string(dtype_));
    return {static_cast<T*>(data_), count_};
  }

 private:
  void* data_ = nullptr;
  std::size_t count_ = 0;
  DType dtype_ = DType::u8;
  MemoryKind memory_ = MemoryKind::host;
  int device_ = -1;
  Stream* stream_ = nullptr;
};

// The stream a call on `input` and `output` is ordered on: the one either names (input's
// first), null where neither does.
inline Stream* stream_of(const Buffer& input, const Buffer& output) noexcept {
  return input.stream() != nullptr ? input.stream() : output.stream();
}

}  // namespace braid
