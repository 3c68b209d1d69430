// Wire protocol of the rendezvous store (private: the server and the client include it,
// nothing else does). Encoding and decoding only; store_frame_io.hpp moves frames on a socket.
//
// Every message is one frame. All integers are little-endian.
//
//   u32 length      bytes that follow: 9 (opcode + request id) up to kMaxFrameBody
//   u8  opcode
//   u64 request id  chosen by the client, echoed by the server's reply; replies come back
//                   in any order (a get waiting for its key does not hold up a set)
//   ... payload     opcode-specific, see below
//
// Payload fields: `str` and `bytes` are a u32 length and that many bytes; `ms` is a u64
// count of milliseconds; `rest` is everything up to the end of the frame.
//
//   client -> server  payload                                   payload of the ok reply
//   0x01 hello        u32 magic "BRST", u16 version, str token  (empty)
//   0x02 set          str key, bytes value                      (empty)
//   0x03 get          str key, ms timeout                       rest: the value
//   0x04 add          str key, i64 delta                        i64: the new value
//   0x05 compare_set  str key, bytes expected, bytes desired    rest: the value afterwards
//   0x06 erase        str key                                   u8: 1 if the key existed
//   0x07 wait         u32 n, n x str key, ms timeout            (empty)
//   0x08 set_will     str key, bytes value, u8 append           (empty)
//   0x09 clear_will   (empty)                                   (empty)
//   0x0a append       str key, bytes value                      i64: the entry's index
//
//   server -> client
//   0x80 ok           as above
//   0x81 error        u8 braid::Errc, str message
//
// Rules. hello comes first and only once, at most kMaxHelloBody long (so a token of at
// most kMaxTokenBytes); with a token configured, a missing or wrong one gets error(refused)
// and the server closes the connection. Any frame that breaks the protocol (unknown
// opcode, a payload shorter or longer than its fields, a length outside [9, kMaxFrameBody]
// or, before hello, over kMaxHelloBody, a truncated frame) gets error(protocol_error) with
// request id 0 where none could be read, and that connection alone is closed. The server
// also closes connections to keep itself available (store.hpp, StoreServer::Options): no
// hello within the hello timeout, too many connections before hello (the oldest goes),
// or a frame or reply that would take its buffers past their limit (error(refused)).
//
// Wills. set_will registers the connection's will, replacing any earlier one; clear_will
// withdraws it. When the connection closes for any reason other than the server shutting
// down (the client exited, was killed, broke the protocol, stopped reading) with a will
// registered, the server stores the will's value under its key exactly as a set would,
// waking the waiters on that key -- unless the key already exists, in which case it keeps
// the value it has: the first failure reported under a key wins. A will with `append` set
// is appended to the log at its key instead, as an append request would. A client leaving
// on purpose sends clear_will first (its reply tells it the server saw it before the close).
//
// Logs. append keeps a log at `key`: the key holds the number of entries as decimal text
// (so add() and get() read it like a counter) and entry i is stored under "<key>/<i>".
// Readers follow a log with one get per entry, in order, each waiting for the next.
// Version 3 added append and appending wills; a client of another version is refused at
// hello.
//
// Timeouts travel as relative milliseconds because steady clocks of two machines share no
// epoch; the server drops a waiter (replying error(timeout)) once its timeout passes, so a
// client that vanished or gave up leaves nothing behind. The client keeps its own deadline
// and never depends on that reply.
//
// Frames are capped at 64 MiB so a stray length (an HTTP request on the port reads as a
// length near 1 GiB) is rejected before anything is allocated. Values are rendezvous
// metadata (addresses, ids); a client refuses to send a larger frame with invalid_argument.
// Below the cap a reader's buffer grows with the bytes that arrive, not with the length
// announced (store_frame_io.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <braid/core/error.hpp>
#include <braid/transport/store/store.hpp>

namespace braid::transport::store_protocol {

inline constexpr std::uint32_t kMagic = 0x54535242;  // "BRST" as little-endian bytes
inline constexpr std::uint16_t kVersion = 3;
inline constexpr std::size_t kLengthBytes = 4;
inline constexpr std::size_t kHeaderBytes = 1 + 8;  // opcode, request id
inline constexpr std::size_t kMaxFrameBody = std::size_t{64} << 20;
// Before its hello is accepted a connection is a stranger: its one frame may be this long.
inline constexpr std::size_t kMaxHelloBody = 4096;
// What fits in such a hello beside magic (4), version (2) and the token's length (4).
inline constexpr std::size_t kMaxTokenBytes = kMaxHelloBody - kHeaderBytes - 4 - 2 - 4;

enum class Opcode : std::uint8_t {
  hello = 0x01,
  set = 0x02,
  get = 0x03,
  add = 0x04,
  compare_set = 0x05,
  erase = 0x06,
  wait = 0x07,
  set_will = 0x08,
  clear_will = 0x09,
  append = 0x0a,
  ok = 0x80,
  error = 0x81,
};

// A frame without its length prefix: opcode, request id and payload. The opcode is not
// validated here; the decoders below reject the ones they do not expect.
struct Frame {
  Opcode opcode = Opcode::ok;
  std::uint64_t request_id = 0;
  Bytes payload;
};

struct HelloRequest {
  std::string token;
};
struct SetRequest {
  std::string key;
  Bytes value;
};
struct GetRequest {
  std::string key;
  std::chrono::milliseconds timeout{0};
};
struct AddRequest {
  std::string key;
  std::int64_t delta = 0;
};
struct CompareSetRequest {
  std::string key;
  Bytes expected;
  Bytes desired;
};
struct EraseRequest {
  std::string key;
};
struct WaitRequest {
  std::vector<std::string> keys;
  std::chrono::milliseconds timeout{0};
};
struct SetWillRequest {
  std::string key;
  Bytes value;
  bool append = false;  // append to the log at `key` rather than set it
};
struct ClearWillRequest {};
struct AppendRequest {
  std::string key;
  Bytes value;
};
using Request =
    std::variant<HelloRequest, SetRequest, GetRequest, AddRequest, CompareSetRequest, EraseRequest,
                 WaitRequest, SetWillRequest, ClearWillRequest, AppendRequest>;

// Where entry `index` of the log at `key` is stored.
std::string log_entry_key(std::string_view key, std::int64_t index);

// Counters and log counts are decimal text ("42"); nullopt for anything else (empty too).
std::optional<std::int64_t> parse_counter(std::span<const std::uint8_t> value);
// The invalid_argument messages of add and append on a key that holds no count, and of an
// add that overflows: every store says them alike.
std::string not_a_counter(std::string_view key, std::size_t bytes);
std::string not_an_entry_count(std::string_view key, std::size_t bytes);
std::string counter_overflow(std::string_view key, std::int64_t delta, std::int64_t current);

struct ErrorReply {
  Errc code = Errc::protocol_error;
  std::string message;
};

// The length announced by a frame's first four bytes; throws Error(protocol_error)
// outside [kHeaderBytes, kMaxFrameBody].
std::size_t decode_length(std::span<const std::uint8_t, kLengthBytes> prefix);
// Opcode and request id of the kHeaderBytes that follow the length; payload left empty.
Frame decode_header(std::span<const std::uint8_t, kHeaderBytes> header);

// Whole frames, length prefix included, ready to write. Throw Error(invalid_argument)
// when the frame would exceed kMaxFrameBody.
Bytes encode_request(std::uint64_t request_id, const Request& request);
Bytes encode_ok(std::uint64_t request_id, std::span<const std::uint8_t> payload);
Bytes encode_ok_int64(std::uint64_t request_id, std::int64_t value);
Bytes encode_ok_bool(std::uint64_t request_id, bool value);
Bytes encode_error(std::uint64_t request_id, Errc code, std::string_view message);

// Decoders throw Error(protocol_error) naming what is wrong with the frame.
Request decode_request(const Frame& frame);
ErrorReply decode_error(const Frame& frame);
std::int64_t decode_int64(const Frame& frame);
bool decode_bool(const Frame& frame);
void expect_empty(const Frame& frame);

std::string_view to_string(Opcode opcode) noexcept;
// "'a', 'b'": keys as both sides name them in messages.
std::string quote_keys(std::span<const std::string> keys);

}  // namespace braid::transport::store_protocol
