// Recording sites. Every layer records from day one; with tracing off each site costs
// one relaxed atomic load (recorder.hpp has the costs when on).
//
//   // synchronous scope
//   trace::Span span(trace::Category::comm, "all_reduce", comm_track, buffer.size_bytes());
//   span.arg("seq", seq);
//
//   // begun here, ended elsewhere (a completion callback, a later coroutine step)
//   trace::AsyncSpan op = trace::begin(trace::Category::bucket, "bucket", track, bytes);
//   ...
//   op.end();
//
// The track is resolved when the span begins, so a span begun on one thread and ended
// on another (a coroutine that moved threads) stays on the track it began on.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include <braid/trace/recorder.hpp>

namespace braid::trace {

namespace detail {

// The state shared by Span and AsyncSpan. With tracing off only `active_` is written:
// the record is left uninitialised (not even zeroed), so an off site costs the enabled()
// load and a byte store.
class OpenSpan {
 public:
  OpenSpan() noexcept {}  // inactive: records nothing
  OpenSpan(RecordKind kind, Category category, Name name, Track track,
           std::uint64_t bytes) noexcept {
    if (!enabled()) return;
    // A synchronous span ends on the thread it began on, whose track append() fills in;
    // only a span that may end elsewhere looks its track up now (one call saved per span).
    std::uint32_t resolved = track.id;
    if (kind != RecordKind::span) {
      resolved = resolve(track);
      if (resolved == 0) return;
    }
    Record& record_ = *std::construct_at(&storage_.record);
    record_.kind = kind;
    record_.category = category;
    record_.name = name.c_str();
    record_.track = resolved;
    record_.bytes = bytes;
    record_.begin_ns = detail::now_stamp();
    active_ = true;
  }

  bool active() const noexcept { return active_; }
  void set_bytes(std::uint64_t bytes) noexcept {
    if (active_) storage_.record.bytes = bytes;
  }
  // Up to kMaxArgs arguments; further ones are dropped.
  void arg(Name key, std::int64_t value) noexcept {
    if (active_ && storage_.record.arg_count < kMaxArgs) {
      storage_.record.args[storage_.record.arg_count++] = Arg{key.c_str(), value};
    }
  }
  // One text argument; a second call replaces the first.
  void text(Name key, Name value) noexcept {
    if (active_) {
      storage_.record.text_key = key.c_str();
      storage_.record.text = value.c_str();
    }
  }
  void end() noexcept {
    if (!active_) return;
    active_ = false;
    storage_.record.end_ns = detail::now_stamp();
    append(storage_.record);
  }

 protected:
  union Storage {
    Storage() noexcept {}
    Record record;  // alive only while active_
  };
  Storage storage_;
  bool active_ = false;
};

}  // namespace detail

// A synchronous scope: begins at construction, ends at destruction, on one thread.
class Span : private detail::OpenSpan {
 public:
  Span(Category category, Name name, Track track = {}, std::uint64_t bytes = 0) noexcept
      : OpenSpan(RecordKind::span, category, name, track, bytes) {}
  ~Span() { end(); }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  using OpenSpan::active;
  using OpenSpan::arg;
  using OpenSpan::set_bytes;
  using OpenSpan::text;
};

// A span whose end is elsewhere: movable, ended by end() or, failing that, by its
// destructor (so an exception does not lose it). Ending twice records once.
class AsyncSpan : private detail::OpenSpan {
 public:
  AsyncSpan() noexcept = default;  // records nothing (a site that chose not to trace)
  AsyncSpan(Category category, Name name, Track track = {}, std::uint64_t bytes = 0) noexcept
      : OpenSpan(RecordKind::async_span, category, name, track, bytes) {}
  AsyncSpan(AsyncSpan&& other) noexcept : OpenSpan(other) { other.active_ = false; }
  AsyncSpan& operator=(AsyncSpan&& other) noexcept {
    if (this != &other) {
      end();
      OpenSpan::operator=(other);
      other.active_ = false;
    }
    return *this;
  }
  ~AsyncSpan() { end(); }

  using OpenSpan::active;
  using OpenSpan::arg;
  using OpenSpan::end;
  using OpenSpan::set_bytes;
  using OpenSpan::text;
};

inline AsyncSpan begin(Category category, Name name, Track track = {},
                       std::uint64_t bytes = 0) noexcept {
  return AsyncSpan(category, name, track, bytes);
}

// A point in time.
inline void instant(Category category, Name name, Track track = {},
                    std::uint64_t bytes = 0) noexcept {
  if (!enabled()) return;
  Record record;
  record.kind = RecordKind::instant;
  record.category = category;
  record.name = name.c_str();
  record.track = track.id;
  record.bytes = bytes;
  record.begin_ns = record.end_ns = detail::now_stamp();
  detail::append(record);
}

// A sampled value (queue depth, bytes in flight), drawn as a counter track by the
// exporter. The value is args[0], keyed by the counter's name.
inline void counter(Category category, Name name, std::int64_t value, Track track = {}) noexcept {
  if (!enabled()) return;
  Record record;
  record.kind = RecordKind::counter;
  record.category = category;
  record.name = name.c_str();
  record.track = track.id;
  record.args[0] = Arg{name.c_str(), value};
  record.arg_count = 1;
  record.begin_ns = record.end_ns = detail::now_stamp();
  detail::append(record);
}

}  // namespace braid::trace
