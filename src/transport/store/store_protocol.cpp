#include "transport/store/store_protocol.hpp"

#include <algorithm>
#include <charconv>
#include <type_traits>

#include <fmt/format.h>

namespace braid::transport::store_protocol {
namespace {

[[noreturn]] void malformed(std::string_view what) {
  throw Error(Errc::protocol_error, std::string(what), {.operation = "store.decode"});
}

// Appends little-endian fields to a frame and fills in the length prefix last.
class FrameWriter {
 public:
  FrameWriter(Opcode opcode, std::uint64_t request_id) {
    out_.resize(kLengthBytes);
    put_u8(static_cast<std::uint8_t>(opcode));
    put_u64(request_id);
  }

  void put_u8(std::uint8_t value) { put_le(value); }
  void put_u16(std::uint16_t value) { put_le(value); }
  void put_u32(std::uint32_t value) { put_le(value); }
  void put_u64(std::uint64_t value) { put_le(value); }
  void put_i64(std::int64_t value) { put_le(static_cast<std::uint64_t>(value)); }
  void put_rest(std::span<const std::uint8_t> bytes) {
    check_fits(bytes.size());
    out_.insert(out_.end(), bytes.begin(), bytes.end());
  }
  void put_bytes(std::span<const std::uint8_t> bytes) {
    put_length(bytes.size());
    put_rest(bytes);
  }
  void put_string(std::string_view text) {
    put_length(text.size());
    check_fits(text.size());
    out_.insert(out_.end(), text.begin(), text.end());
  }

  Bytes finish() && {
    const std::size_t body = out_.size() - kLengthBytes;
    for (std::size_t i = 0; i < kLengthBytes; ++i) {
      out_[i] = static_cast<std::uint8_t>(body >> (8 * i));
    }
    return std::move(out_);
  }

 private:
  template <class T>
  void put_le(T value) {
    check_fits(sizeof(T));
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      out_.push_back(static_cast<std::uint8_t>(value >> (8 * i)));
    }
  }
  // Checked before copying, so an oversized value costs no copy.
  void check_fits(std::size_t more) const {
    const std::size_t body = out_.size() - kLengthBytes + more;
    if (body > kMaxFrameBody) {
      throw Error(Errc::invalid_argument,
                  fmt::format("a store frame of at least {} bytes exceeds the {} MiB limit", body,
                              kMaxFrameBody >> 20),
                  {.operation = "store.encode"});
    }
  }
  // A length too large for u32 cannot fit in a frame either: check_fits() throws on the
  // field that follows.
  void put_length(std::size_t size) { put_u32(static_cast<std::uint32_t>(size)); }

  Bytes out_;
};

// Reads little-endian fields from a payload; every read checks the bytes are there.
class PayloadReader {
 public:
  explicit PayloadReader(const Frame& frame) : frame_(frame), rest_(frame.payload) {}

  std::uint8_t u8() { return take_le<std::uint8_t>("u8"); }
  std::uint16_t u16() { return take_le<std::uint16_t>("u16"); }
  std::uint32_t u32() { return take_le<std::uint32_t>("u32"); }
  std::uint64_t u64() { return take_le<std::uint64_t>("u64"); }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  std::chrono::milliseconds ms() {
    // Clamped so that converting to a duration cannot overflow; no wait lasts 2^40 ms.
    return std::chrono::milliseconds(std::min<std::uint64_t>(u64(), std::uint64_t{1} << 40));
  }
  std::span<const std::uint8_t> span(std::size_t size, std::string_view what) {
    need(size, what);
    auto out = rest_.first(size);
    rest_ = rest_.subspan(size);
    return out;
  }
  Bytes bytes() {
    auto out = span(u32(), "bytes");
    return {out.begin(), out.end()};
  }
  std::string string() {
    auto out = span(u32(), "string");
    return {out.begin(), out.end()};
  }
  void finish() const {
    if (!rest_.empty()) {
      malformed(fmt::format("{} frame has {} unexpected trailing bytes", to_string(frame_.opcode),
                            rest_.size()));
    }
  }

 private:
  void need(std::size_t size, std::string_view what) const {
    if (rest_.size() < size) {
      malformed(fmt::format("{} frame ends inside a {} field ({} of {} bytes)",
                            to_string(frame_.opcode), what, rest_.size(), size));
    }
  }
  template <class T>
  T take_le(std::string_view what) {
    auto raw = span(sizeof(T), what);
    T value = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(T{raw[i]} << (8 * i));
    return value;
  }

  const Frame& frame_;
  std::span<const std::uint8_t> rest_;
};

}  // namespace

std::string_view to_string(Opcode opcode) noexcept {
  switch (opcode) {
    case Opcode::hello:
      return "hello";
    case Opcode::set:
      return "set";
    case Opcode::get:
      return "get";
    case Opcode::add:
      return "add";
    case Opcode::compare_set:
      return "compare_set";
    case Opcode::erase:
      return "erase";
    case Opcode::wait:
      return "wait";
    case Opcode::set_will:
      return "set_will";
    case Opcode::append:
      return "append";
    case Opcode::clear_will:
      return "clear_will";
    case Opcode::ok:
      return "ok";
    case Opcode::error:
      return "error";
  }
  return "unknown";
}

std::string log_entry_key(std::string_view key, std::int64_t index) {
  return fmt::format("{}/{}", key, index);
}

std::optional<std::int64_t> parse_counter(std::span<const std::uint8_t> value) {
  std::int64_t count = 0;
  const auto* first = reinterpret_cast<const char*>(value.data());
  const auto* last = first + value.size();
  auto [end, error] = std::from_chars(first, last, count);
  if (value.empty() || error != std::errc() || end != last) return std::nullopt;
  return count;
}

std::string not_a_counter(std::string_view key, std::size_t bytes) {
  return fmt::format(
      "key '{}' holds {} bytes that are not a decimal integer, so add cannot update it", key,
      bytes);
}

std::string not_an_entry_count(std::string_view key, std::size_t bytes) {
  return fmt::format(
      "key '{}' holds {} bytes that are not an entry count, so append cannot add to its log", key,
      bytes);
}

std::string counter_overflow(std::string_view key, std::int64_t delta, std::int64_t current) {
  return fmt::format("adding {} to key '{}' (now {}) overflows int64", delta, key, current);
}

std::string quote_keys(std::span<const std::string> keys) {
  std::string out;
  for (const std::string& key : keys) out += fmt::format("{}'{}'", out.empty() ? "" : ", ", key);
  return out;
}

std::size_t decode_length(std::span<const std::uint8_t, kLengthBytes> prefix) {
  std::size_t length = 0;
  for (std::size_t i = 0; i < kLengthBytes; ++i) length |= std::size_t{prefix[i]} << (8 * i);
  if (length < kHeaderBytes || length > kMaxFrameBody) {
    malformed(fmt::format("frame length {} is outside [{}, {}] (not a braid store client?)", length,
                          kHeaderBytes, kMaxFrameBody));
  }
  return length;
}

Frame decode_header(std::span<const std::uint8_t, kHeaderBytes> header) {
  Frame frame;
  frame.opcode = static_cast<Opcode>(header[0]);
  for (std::size_t i = 0; i < 8; ++i) frame.request_id |= std::uint64_t{header[1 + i]} << (8 * i);
  return frame;
}

Bytes encode_request(std::uint64_t request_id, const Request& request) {
  return std::visit(
      [&](const auto& r) -> Bytes {
        using R = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<R, HelloRequest>) {
          FrameWriter w(Opcode::hello, request_id);
          w.put_u32(kMagic);
          w.put_u16(kVersion);
          w.put_string(r.token);
          return std::move(w).finish();
        } else if constexpr (std::is_same_v<R, SetRequest>) {
          FrameWriter w(Opcode::set, request_id);
          w.put_string(r.key);
          w.put_bytes(r.value);
          return std::move(w).finish();
        } else if constexpr (std::is_same_v<R, GetRequest>) {
          FrameWriter w(Opcode::get, request_id);
          w.put_string(r.key);
          w.put_u64(static_cast<std::uint64_t>(std::max<std::int64_t>(r.timeout.count(), 0)));
          return std::move(w).finish();
        } else if constexpr (std::is_same_v<R, AddRequest>) {
          FrameWriter w(Opcode::add, request_id);
          w.put_string(r.key);
          w.put_i64(r.delta);
          return std::move(w).finish();
        } else if constexpr (std::is_same_v<R, CompareSetRequest>) {
          FrameWriter w(Opcode::compare_set, request_id);
          w.put_string(r.key);
          w.put_bytes(r.expected);
          w.put_bytes(r.desired);
          return std::move(w).finish();
        } else if constexpr (std::is_same_v<R, EraseRequest>) {
          FrameWriter w(Opcode::erase, request_id);
          w.put_string(r.key);
          return std::move(w).finish();
        } else if constexpr (std::is_same_v<R, WaitRequest>) {
          FrameWriter w(Opcode::wait, request_id);
          w.put_u32(static_cast<std::uint32_t>(r.keys.size()));
          for (const std::string& key : r.keys) w.put_string(key);
          w.put_u64(static_cast<std::uint64_t>(std::max<std::int64_t>(r.timeout.count(), 0)));
          return std::move(w).finish();
        } else if constexpr (std::is_same_v<R, SetWillRequest>) {
          FrameWriter w(Opcode::set_will, request_id);
          w.put_string(r.key);
          w.put_bytes(r.value);
          w.put_u8(r.append ? 1 : 0);
          return std::move(w).finish();
        } else if constexpr (std::is_same_v<R, AppendRequest>) {
          FrameWriter w(Opcode::append, request_id);
          w.put_string(r.key);
          w.put_bytes(r.value);
          return std::move(w).finish();
        } else {
          static_assert(std::is_same_v<R, ClearWillRequest>);
          return FrameWriter(Opcode::clear_will, request_id).finish();
        }
      },
      request);
}

Bytes encode_ok(std::uint64_t request_id, std::span<const std::uint8_t> payload) {
  FrameWriter w(Opcode::ok, request_id);
  w.put_rest(payload);
  return std::move(w).finish();
}

Bytes encode_ok_int64(std::uint64_t request_id, std::int64_t value) {
  FrameWriter w(Opcode::ok, request_id);
  w.put_i64(value);
  return std::move(w).finish();
}

Bytes encode_ok_bool(std::uint64_t request_id, bool value) {
  FrameWriter w(Opcode::ok, request_id);
  w.put_u8(value ? 1 : 0);
  return std::move(w).finish();
}

Bytes encode_error(std::uint64_t request_id, Errc code, std::string_view message) {
  FrameWriter w(Opcode::error, request_id);
  w.put_u8(static_cast<std::uint8_t>(code));
  w.put_string(message);
  return std::move(w).finish();
}

Request decode_request(const Frame& frame) {
  PayloadReader r(frame);
  Request out;
  switch (frame.opcode) {
    case Opcode::hello: {
      const std::uint32_t magic = r.u32();
      if (magic != kMagic) malformed(fmt::format("hello has magic {:#010x}, not \"BRST\"", magic));
      const std::uint16_t version = r.u16();
      if (version != kVersion) {
        malformed(fmt::format("protocol version {} is not the server's {}", version, kVersion));
      }
      out = HelloRequest{r.string()};
      break;
    }
    case Opcode::set: {
      std::string key = r.string();
      out = SetRequest{std::move(key), r.bytes()};
      break;
    }
    case Opcode::get: {
      std::string key = r.string();
      out = GetRequest{std::move(key), r.ms()};
      break;
    }
    case Opcode::add: {
      std::string key = r.string();
      out = AddRequest{std::move(key), r.i64()};
      break;
    }
    case Opcode::compare_set: {
      std::string key = r.string();
      Bytes expected = r.bytes();
      out = CompareSetRequest{std::move(key), std::move(expected), r.bytes()};
      break;
    }
    case Opcode::erase:
      out = EraseRequest{r.string()};
      break;
    case Opcode::wait: {
      const std::uint32_t count = r.u32();
      WaitRequest wait;
      // Each key takes at least its 4-byte length, so `count` cannot make us reserve more
      // than the frame could describe.
      wait.keys.reserve(std::min<std::size_t>(count, frame.payload.size() / 4));
      for (std::uint32_t i = 0; i < count; ++i) wait.keys.push_back(r.string());
      wait.timeout = r.ms();
      out = std::move(wait);
      break;
    }
    case Opcode::set_will: {
      std::string key = r.string();
      Bytes value = r.bytes();
      const std::uint8_t append = r.u8();
      if (append > 1) malformed(fmt::format("set_will's append field holds {}", append));
      out = SetWillRequest{std::move(key), std::move(value), append == 1};
      break;
    }
    case Opcode::append: {
      std::string key = r.string();
      out = AppendRequest{std::move(key), r.bytes()};
      break;
    }
    case Opcode::clear_will:
      out = ClearWillRequest{};
      break;
    default:
      malformed(
          fmt::format("opcode {:#04x} is not a request", static_cast<unsigned>(frame.opcode)));
  }
  r.finish();
  return out;
}

ErrorReply decode_error(const Frame& frame) {
  BRAID_ENFORCE(frame.opcode == Opcode::error, "decode_error on a {} frame",
                to_string(frame.opcode));
  PayloadReader r(frame);
  const std::uint8_t code = r.u8();
  if (code < static_cast<std::uint8_t>(Errc::timeout) ||
      code > static_cast<std::uint8_t>(Errc::cancelled)) {
    malformed(fmt::format("error frame carries unknown error code {}", code));
  }
  ErrorReply out{static_cast<Errc>(code), r.string()};
  r.finish();
  return out;
}

std::int64_t decode_int64(const Frame& frame) {
  PayloadReader r(frame);
  const std::int64_t value = r.i64();
  r.finish();
  return value;
}

bool decode_bool(const Frame& frame) {
  PayloadReader r(frame);
  const std::uint8_t value = r.u8();
  r.finish();
  if (value > 1) malformed(fmt::format("boolean field holds {}", value));
  return value == 1;
}

void expect_empty(const Frame& frame) {
  PayloadReader(frame).finish();
}

}  // namespace braid::transport::store_protocol
