// Per-thread chunked buffers. Each thread appends to the tail chunk of its own buffer
// and publishes each record with a release store of the chunk's count; readers
// (snapshot, clear) hold the registry mutex and read counts with acquire loads, so the
// writer never takes a lock. A chunk is never moved or resized once records are in it.
#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <unordered_map>
#include <unordered_set>

#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/trace/recorder.hpp>

namespace braid::trace {

namespace detail {
std::atomic<bool> enabled_flag{false};
}  // namespace detail

namespace {

// 4096 records of 104 bytes: 416 KiB per chunk, one allocation per 4096 records.
constexpr std::size_t kChunkRecords = 4096;

struct Chunk {
  // Left uninitialised: a slot is written whole before its count is published, so
  // taking a chunk costs no pass over its 416 KiB.
  union Slot {
    Slot() noexcept {}
    Record record;
  };
  std::array<Slot, kChunkRecords> records;
  std::atomic<std::size_t> count{0};  // written by the owning thread only
  std::atomic<std::size_t> first{0};  // records before it were cleared (under a lock)
  std::atomic<Chunk*> next{nullptr};
};

struct ThreadBuffer {
  std::uint32_t track = 0;
  Chunk* tail = nullptr;              // the owning thread only
  std::atomic<Chunk*> head{nullptr};  // moved on under chain_mutex (or, exited, the registry's)
  bool exited = false;                // registry mutex
  // Held (inside the registry mutex) while a snapshot copies this buffer or clear()
  // frees its chunks, and by the owner while it takes back its oldest chunk at the memory
  // limit: so a thread at the limit waits only for its own buffer's copy.
  std::mutex chain_mutex;
};

// Chunks come from mmap with MAP_POPULATE: the kernel faults the pages in with the
// mapping, in one call, instead of a recording thread taking ~110 page faults (a few
// microseconds each on a VM) as it writes its way through a fresh chunk. Cleared chunks
// go back to a pool (ChunkPool) and are reused, already faulted in.
Chunk* map_chunk() noexcept {
  void* memory = ::mmap(nullptr, sizeof(Chunk), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (memory == MAP_FAILED) return nullptr;
  return new (memory) Chunk;
}

// BRAID_TRACE_BUFFER_MB in chunks; 0 or a malformed value (which World::join reports)
// gives the default.
std::size_t limit_from_environment() noexcept {
  std::int64_t mib = 256;
  try {
    mib = config::int_value("BRAID_TRACE_BUFFER_MB");
  } catch (...) {
  }
  if (mib <= 0) mib = 256;
  const std::size_t bytes = static_cast<std::size_t>(mib) * (std::size_t{1} << 20);
  return std::max<std::size_t>(bytes / sizeof(Chunk), 1);
}

class ChunkPool {
 public:
  // A chunk, whatever the limit (every recording thread keeps at least one), or nullptr
  // when out of memory.
  Chunk* take() noexcept {
    live_.fetch_add(1, std::memory_order_relaxed);
    return take_counted();
  }
  // A chunk if one more keeps every buffer within the limit, else nullptr. Counting the
  // chunk in before making it keeps threads that fill their chunks at the same moment
  // from all passing the check and growing past the limit together.
  Chunk* take_within_limit() noexcept {
    const std::size_t limit = this->limit();
    std::size_t live = live_.load(std::memory_order_relaxed);
    do {
      if (live >= limit) return nullptr;
    } while (!live_.compare_exchange_weak(live, live + 1, std::memory_order_relaxed));
    return take_counted();
  }
  // Whether one more chunk keeps every buffer within the limit.
  bool may_grow() noexcept { return live_.load(std::memory_order_relaxed) < limit(); }
  void give(Chunk* chunk) {
    chunk->~Chunk();
    live_.fetch_sub(1, std::memory_order_relaxed);
    std::lock_guard lock(mutex_);
    free_.push_back(chunk);
  }
  void set_limit(std::size_t chunks) noexcept {
    limit_.store(std::max<std::size_t>(chunks, 1), std::memory_order_relaxed);
  }

 private:
  std::size_t limit() noexcept {
    std::size_t limit = limit_.load(std::memory_order_relaxed);
    if (limit == 0) {
      limit = limit_from_environment();
      limit_.store(limit, std::memory_order_relaxed);
    }
    return limit;
  }
  // A chunk already counted in live_ (uncounted again if none can be had).
  Chunk* take_counted() noexcept {
    Chunk* chunk = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        chunk = new (free_.back()) Chunk;
        free_.pop_back();
      }
    }
    if (chunk == nullptr) chunk = map_chunk();
    if (chunk == nullptr) live_.fetch_sub(1, std::memory_order_relaxed);
    return chunk;
  }

  std::mutex mutex_;
  std::vector<Chunk*> free_;
  std::atomic<std::size_t> live_{0};   // chunks in threads' buffers, and being made
  std::atomic<std::size_t> limit_{0};  // 0: not read from the environment yet
};

// Never destroyed, like the registry.
ChunkPool& chunk_pool() {
  static ChunkPool* pool = new ChunkPool;
  return *pool;
}

void free_chunks(Chunk* from, const Chunk* until) {
  while (from != until) {
    Chunk* next = from->next.load(std::memory_order_acquire);
    chunk_pool().give(from);
    from = next;
  }
}

class Registry {
 public:
  ThreadBuffer* add_thread() {
    auto buffer = std::make_unique<ThreadBuffer>();
    // At the limit a new thread starts in an exited thread's oldest chunk, so threads
    // that come and go do not grow the records past it.
    Chunk* chunk = nullptr;
    if (!chunk_pool().may_grow()) {
      std::lock_guard lock(mutex_);
      chunk = take_exited_chunk();
    }
    if (chunk == nullptr) chunk = chunk_pool().take();
    if (chunk == nullptr) throw std::bad_alloc();
    buffer->tail = chunk;
    buffer->head.store(chunk, std::memory_order_release);

    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof name);
    std::lock_guard lock(mutex_);
    buffer->track = add_track(TrackInfo{.name = name, .thread = true, .os_thread_id = gettid()});
    buffers_.push_back(std::move(buffer));
    return buffers_.back().get();
  }

  void thread_exited(ThreadBuffer* buffer) {
    std::lock_guard lock(mutex_);
    buffer->exited = true;
  }

  Track named_track(std::string_view name) {
    std::lock_guard lock(mutex_);
    auto it = named_.find(std::string(name));
    if (it != named_.end()) return Track{it->second};
    const std::uint32_t id = add_track(TrackInfo{.name = std::string(name)});
    named_.emplace(std::string(name), id);
    return Track{id};
  }

  const char* intern(std::string_view text) {
    std::lock_guard lock(mutex_);
    return names_.emplace(text).first->c_str();
  }

  Snapshot snapshot() {
    Snapshot out;
    {
      std::lock_guard lock(mutex_);
      out.tracks = tracks_;
      for (const auto& buffer : buffers_) {
        std::lock_guard chain(buffer->chain_mutex);
        for (Chunk* chunk = buffer->head.load(std::memory_order_acquire); chunk != nullptr;
             chunk = chunk->next.load(std::memory_order_acquire)) {
          const std::size_t end = chunk->count.load(std::memory_order_acquire);
          const std::size_t begin = chunk->first.load(std::memory_order_relaxed);
          for (std::size_t i = begin; i < end; ++i) out.records.push_back(chunk->records[i].record);
        }
      }
      out.overwritten = overwritten_.load(std::memory_order_relaxed);
    }
    // Converted and sorted outside the locks: nobody waits for it.
    detail::stamps_to_ns(out.records);
    std::stable_sort(out.records.begin(), out.records.end(), [](const Record& a, const Record& b) {
      if (a.track != b.track) return a.track < b.track;
      if (a.begin_ns != b.begin_ns) return a.begin_ns < b.begin_ns;
      return a.end_ns > b.end_ns;
    });
    return out;
  }

  void clear() {
    std::lock_guard lock(mutex_);
    overwritten_.store(0, std::memory_order_relaxed);
    std::erase_if(buffers_, [](const std::unique_ptr<ThreadBuffer>& buffer) {
      if (!buffer->exited) return false;
      free_chunks(buffer->head.load(std::memory_order_acquire), nullptr);
      return true;
    });
    for (const auto& buffer : buffers_) {
      std::lock_guard chain(buffer->chain_mutex);
      // The owner only writes into its tail chunk, which is the last one linked; every
      // chunk before the last one seen here is full and untouched, so it can go.
      Chunk* head = buffer->head.load(std::memory_order_acquire);
      Chunk* last = head;
      while (Chunk* next = last->next.load(std::memory_order_acquire)) last = next;
      free_chunks(head, last);
      buffer->head.store(last, std::memory_order_release);
      last->first.store(last->count.load(std::memory_order_acquire), std::memory_order_relaxed);
    }
  }

  // Past the limit: the owner of `buffer`, whose tail chunk is full, needs another. First
  // choice, the oldest chunk of a thread that has exited (if the registry is free right
  // now: a writer never waits for a snapshot of other threads); else its own oldest,
  // under its own buffer's lock, so no snapshot is reading that chunk and no clear() is
  // freeing it. Once per kChunkRecords records.
  Chunk* recycle_oldest(ThreadBuffer& buffer) {
    Chunk* reused = nullptr;
    if (mutex_.try_lock()) {
      reused = take_exited_chunk();
      mutex_.unlock();
    }
    if (reused != nullptr) {
      buffer.tail->next.store(reused, std::memory_order_release);
      buffer.tail = reused;
      return reused;
    }
    std::lock_guard chain(buffer.chain_mutex);
    Chunk* oldest = overwrite(buffer.head.load(std::memory_order_acquire));
    if (oldest == buffer.tail) return oldest;  // its only chunk: start it over
    buffer.head.store(oldest->next.load(std::memory_order_acquire), std::memory_order_release);
    oldest->next.store(nullptr, std::memory_order_relaxed);
    buffer.tail->next.store(oldest, std::memory_order_release);
    buffer.tail = oldest;
    return oldest;
  }

 private:
  // Needs mutex_. The oldest chunk of an exited thread's buffer, emptied (its records
  // count as overwritten), or nullptr; a buffer left with no chunk goes.
  Chunk* take_exited_chunk() {
    for (auto it = buffers_.begin(); it != buffers_.end(); ++it) {
      ThreadBuffer& exited = **it;
      if (!exited.exited) continue;
      Chunk* oldest = exited.head.load(std::memory_order_acquire);
      Chunk* next = oldest->next.load(std::memory_order_acquire);
      if (next == nullptr) {
        buffers_.erase(it);
      } else {
        exited.head.store(next, std::memory_order_release);
        oldest->next.store(nullptr, std::memory_order_relaxed);
      }
      return overwrite(oldest);
    }
    return nullptr;
  }

  // Counts the records `chunk` still holds as overwritten and empties it for reuse.
  Chunk* overwrite(Chunk* chunk) noexcept {
    overwritten_.fetch_add(
        chunk->count.load(std::memory_order_relaxed) - chunk->first.load(std::memory_order_relaxed),
        std::memory_order_relaxed);
    chunk->first.store(0, std::memory_order_relaxed);
    chunk->count.store(0, std::memory_order_release);
    return chunk;
  }

  // Needs mutex_.
  std::uint32_t add_track(TrackInfo info) {
    info.id = static_cast<std::uint32_t>(tracks_.size() + 1);  // 0 is "this thread"
    tracks_.push_back(std::move(info));
    return tracks_.back().id;
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<ThreadBuffer>> buffers_;
  std::vector<TrackInfo> tracks_;
  std::unordered_map<std::string, std::uint32_t> named_;
  std::unordered_set<std::string> names_;      // node-based: the strings never move
  std::atomic<std::uint64_t> overwritten_{0};  // records recycled since the last clear()
};

// Never destroyed: threads may record (or exit) while static destructors run.
Registry& registry() {
  static Registry* instance = new Registry;
  return *instance;
}

// The default (global-dynamic) TLS model, not initial-exec: one initial-exec variable puts
// all of libbraid's thread-locals (~5 KB: asio's, the log's) in glibc's static TLS surplus,
// whose 512 spare bytes a library loaded by dlopen cannot fit in, and Python loads
// libbraid that way (the braid_torch module: "cannot allocate memory in static TLS
// block"). A recording site pays a call to __tls_get_addr for t_buffer instead of one
// %fs-relative load.
thread_local ThreadBuffer* t_buffer = nullptr;
thread_local bool t_exited = false;

struct ThreadExitHook {
  ~ThreadExitHook() {
    if (t_buffer != nullptr) registry().thread_exited(t_buffer);
    t_buffer = nullptr;
    t_exited = true;
  }
};

ThreadBuffer* this_thread_buffer() noexcept {
  if (t_buffer != nullptr) [[likely]]
    return t_buffer;
  if (t_exited) return nullptr;
  try {
    thread_local ThreadExitHook hook;
    (void)hook;
    t_buffer = registry().add_thread();
  } catch (...) {
    return nullptr;  // out of memory: this thread records nothing
  }
  return t_buffer;
}

}  // namespace

std::string_view to_string(Category category) noexcept {
  switch (category) {
    case Category::compute:
      return "compute";
    case Category::comm:
      return "comm";
    case Category::step:
      return "step";
    case Category::transport:
      return "transport";
    case Category::hook:
      return "hook";
    case Category::bucket:
      return "bucket";
    case Category::pipeline:
      return "pipeline";
    case Category::stream:
      return "stream";
    case Category::store:
      return "store";
    case Category::user:
      return "user";
  }
  return "?";
}

Name intern(std::string_view text) {
  return Name(registry().intern(text), Name::FromInterned{});
}

Track track(std::string_view name) {
  return registry().named_track(name);
}

void set_enabled(bool on) noexcept {
  detail::enabled_flag.store(on, std::memory_order_relaxed);
}

Snapshot snapshot() {
  return registry().snapshot();
}

void clear() {
  registry().clear();
}

void set_buffer_limit(std::size_t bytes) {
  chunk_pool().set_limit(bytes / sizeof(Chunk));
}

namespace detail {

std::uint32_t resolve(Track track) noexcept {
  if (track.id != 0) return track.id;
  ThreadBuffer* buffer = this_thread_buffer();
  return buffer != nullptr ? buffer->track : 0;
}

void append(const Record& record) noexcept {
  ThreadBuffer* buffer = this_thread_buffer();
  if (buffer == nullptr) return;
  Chunk* chunk = buffer->tail;
  std::size_t n = chunk->count.load(std::memory_order_relaxed);
  if (n == kChunkRecords) [[unlikely]] {
    Chunk* fresh = chunk_pool().take_within_limit();
    if (fresh != nullptr) {
      chunk->next.store(fresh, std::memory_order_release);
      buffer->tail = chunk = fresh;
    } else {
      // At the limit, or out of memory: overwrite this thread's oldest records.
      try {
        chunk = registry().recycle_oldest(*buffer);
      } catch (...) {
        return;  // the mutex failed: drop this record
      }
    }
    n = 0;
  }
  Record& slot = *std::construct_at(&chunk->records[n].record, record);
  if (slot.track == 0) slot.track = buffer->track;
  chunk->count.store(n + 1, std::memory_order_release);
}

}  // namespace detail

std::int64_t origin_of(const Snapshot& snapshot) {
  if (snapshot.records.empty()) return now_ns();
  std::int64_t origin = snapshot.records.front().begin_ns;
  for (const Record& record : snapshot.records) origin = std::min(origin, record.begin_ns);
  return origin;
}

}  // namespace braid::trace
