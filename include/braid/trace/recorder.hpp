// The trace recorder: what every layer records into, and what the exporter and the
// overlap analysis read back. Recording sites use span.hpp; this header holds the data
// model, the on/off switch, named tracks and names, and snapshot()/clear().
//
// Cost. Off: a recording site is one relaxed atomic load (enabled()) and a branch.
// On: two counter reads per span (detail::now_stamp(), converted to ns by snapshot()) plus a copy
// of one Record (104 bytes) into the calling thread's buffer, with no lock and no allocation except
// one chunk of kChunkRecords records when the previous chunk is full. A thread's first record
// registers its buffer under a mutex, once. Buffers outlive their threads: records from
// threads that have exited stay until clear().
//
// Memory. All buffers together hold at most BRAID_TRACE_BUFFER_MB (256 MiB, ~2.6M
// records): a long run keeps its latest records rather than growing until it runs out of
// memory. Past the limit, a thread whose chunk is full reuses the oldest chunk of a thread
// that has exited, else its own oldest (once per chunk, waiting at most for a snapshot's
// copy of its own records), and Snapshot::overwritten counts what was lost.
//
// Tracks are the rows of a timeline: by default the recording thread's own track;
// otherwise a named track (a stream, a communicator) interned by track(name).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace braid::trace {

enum class Category : std::uint8_t {
  compute,    // forward/backward work, reduction kernels
  comm,       // collectives and point-to-point operations as the user sees them
  step,       // a phase inside a collective (a ring's reduce-scatter, a copy into shared memory)
  transport,  // UCX sends, receives and progress
  hook,       // autograd hooks and comm hooks
  bucket,     // gradient bucket lifetime (filled, launched, reduced)
  pipeline,   // pipeline schedule actions
  stream,     // stream and event waits
  store,      // rendezvous store requests
  user,       // anything an application records itself
};

std::string_view to_string(Category category) noexcept;

// A string that lives for the rest of the process: a string literal (checked at compile
// time) or the result of intern(). Records keep only the pointer, so recording never
// copies or allocates a name.
class Name {
 public:
  template <std::size_t N>
  consteval Name(const char (&literal)[N]) : text_(literal) {}  // NOLINT: implicit on purpose

  const char* c_str() const noexcept { return text_; }
  std::string_view view() const noexcept { return text_; }
  friend bool operator==(Name a, Name b) noexcept { return a.view() == b.view(); }

 private:
  friend Name intern(std::string_view text);
  struct FromInterned {};
  Name(const char* text, FromInterned) : text_(text) {}

  const char* text_;
};

// A Name for a string built at run time (an algorithm picked from a table, a hook's
// configured name). Takes a mutex and may allocate: call it at setup, not per record.
// Equal strings give the same pointer.
Name intern(std::string_view text);

// A timeline row. Track{} (id 0) means "the recording thread's own track".
struct Track {
  std::uint32_t id = 0;
  friend bool operator==(Track, Track) = default;
};

// The track named `name`, created on first use; the same name always gives the same id.
// Takes a mutex: look tracks up once and keep the Track.
Track track(std::string_view name);

enum class RecordKind : std::uint8_t {
  span,        // a scope on one thread: spans on one track nest
  async_span,  // begun and ended in different places: may overlap others on its track
  instant,     // a point in time
  counter,     // a point in time carrying a value (args[0])
};

// Collective spans use all three (comm, seq, and sampled where sampled; the algorithm is
// the text argument): a fourth arg() on them is dropped. Raise this before adding one
// (each costs every record 16 bytes).
inline constexpr std::size_t kMaxArgs = 3;

struct Arg {
  const char* key = nullptr;  // a Name's text
  std::int64_t value = 0;
};

struct Record {
  // Steady-clock ns (now_ns()) in a snapshot. While a record sits in its thread's buffer
  // they are stamps (detail::now_stamp(): the raw counter, converted by snapshot()),
  // unless `ns` says they are ns already.
  std::int64_t begin_ns = 0;
  std::int64_t end_ns = 0;  // equals begin_ns for instants and counters
  std::uint64_t bytes = 0;
  const char* name = nullptr;  // a Name's text
  std::array<Arg, kMaxArgs> args{};
  // One text argument (the algorithm a collective ran, a hook's kind): a Name's text for
  // both, or nullptr.
  const char* text_key = nullptr;
  const char* text = nullptr;
  std::uint32_t track = 0;  // never 0 in a snapshot: resolved to the thread's track
  Category category = Category::user;
  RecordKind kind = RecordKind::span;
  std::uint8_t arg_count = 0;
  bool ns = false;  // begin_ns/end_ns hold ns, not stamps (every record in a snapshot)
};

struct TrackInfo {
  std::uint32_t id = 0;
  std::string name;               // the track's name, or the thread's name when it registered
  bool thread = false;            // a thread's own track
  std::int64_t os_thread_id = 0;  // gettid() for thread tracks, 0 for named tracks
};

struct Snapshot {
  std::vector<TrackInfo> tracks;  // by id
  // Ordered by track, then begin time, then longer first, so a parent span comes
  // before the spans nested in it.
  std::vector<Record> records;
  // Records overwritten since the last clear() to stay within BRAID_TRACE_BUFFER_MB: the
  // oldest of the threads that recorded the most.
  std::uint64_t overwritten = 0;
};

namespace detail {
extern std::atomic<bool> enabled_flag;
// Appends to the calling thread's buffer, resolving Track{} to the thread's track.
void append(const Record& record) noexcept;
// What recording sites timestamp with: the time-stamp counter where now_ns() reads it
// (a stamp costs the read, ~17 ns on the dev VM; now_ns() adds ~6 ns of scaling under a
// sequence lock), else steady-clock ns. snapshot() turns stamps into now_ns()'s time.
std::int64_t now_stamp() noexcept;
// Stamps to ns, in place, for records whose `ns` is false (snapshot() calls it).
void stamps_to_ns(std::vector<Record>& records);
// The calling thread's track id (registers the thread's buffer on first use); 0 while
// the thread is exiting, when records are dropped.
std::uint32_t resolve(Track track) noexcept;
}  // namespace detail

// The switch. Off by default.
void set_enabled(bool on) noexcept;
inline bool enabled() noexcept {
  return detail::enabled_flag.load(std::memory_order_relaxed);
}

// Steady-clock nanoseconds, the time base of every record. Read from the CPU's
// time-stamp counter and kept in step with steady_clock where the counter is invariant
// (x86-64; about half the cost of steady_clock::now()), else steady_clock::now().
std::int64_t now_ns() noexcept;

// Which clock now_ns() reads, chosen once per process: BRAID_TRACE_CLOCK=auto (the
// counter where it is invariant), tsc or steady. Throws Error(invalid_environment) for a
// malformed value, which now_ns() itself treats as steady.
enum class ClockSource : std::uint8_t { steady, tsc };
ClockSource clock_source();

// Everything recorded and not cleared, from every thread, including threads that have
// exited. Safe while other threads record: a record being written concurrently appears
// in the next snapshot.
Snapshot snapshot();

// The earliest record's begin (steady-clock ns): where a rank's trace counts its times from.
// now_ns() for a snapshot without records.
std::int64_t origin_of(const Snapshot& snapshot);

// The limit on the records' memory, in chunks of records: BRAID_TRACE_BUFFER_MB, read at
// the first record that needs a new chunk; set_buffer_limit overrides it (tests, tools).
// At least one chunk per recording thread is always kept.
void set_buffer_limit(std::size_t bytes);

// Discards every record so far and frees the buffers of exited threads. Threads may
// keep recording while it runs; their later records are kept. Tracks keep their ids.
void clear();

}  // namespace braid::trace
