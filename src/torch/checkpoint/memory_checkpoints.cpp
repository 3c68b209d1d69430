#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <string_view>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <braid/core/buffer.hpp>
#include <braid/core/config.hpp>
#include <braid/core/error.hpp>
#include <braid/core/fault_points.hpp>
#include <braid/core/log.hpp>
#include <braid/torch/checkpoint/memory_checkpoints.hpp>
#include <braid/torch/checkpoint/restore_newest.hpp>

#include "background_job.hpp"
#include "checkpoint_format.hpp"
#include "replicated_shares.hpp"

namespace braid::torch {
namespace {

constexpr char kSlotMagic[8] = {'B', 'R', 'A', 'I', 'D', 'M', 'S', '1'};

// What a slot says about its contents, at its start; the checkpoint's bytes follow at
// kHeaderBytes.
struct SlotHeader {
  char magic[8];
  std::uint32_t condition;  // a SlotCondition, read and written through atomic_ref
  std::uint32_t rank;
  std::uint32_t world;
  std::uint32_t unused;
  std::int64_t step;
  std::uint64_t length;  // the checkpoint's bytes
  std::uint64_t sum;     // SlotSum of them
};
constexpr std::size_t kHeaderBytes = 64;
static_assert(sizeof(SlotHeader) <= kHeaderBytes);

enum SlotCondition : std::uint32_t { kEmpty = 0, kBeingWritten = 1, kWhole = 2 };

// The slot's check: Fletcher's two running sums over the bytes' 8-byte words, in four lanes,
// computed in the same pass as the copy. A checkpoint file's checksum (FNV-1a, a
// multiplication per word) would cost a second pass over the state, twice the memcpy's
// time, on every step; this one costs about 15% over the memcpy. The file's own checksum
// (its last 8 bytes) is left 0 in a slot, and decode() is told not to check it.
class SlotSum {
 public:
  // Copies `size` bytes to `to` (or, with `to` null, only reads them) and adds them.
  void add(char* to, const char* from, std::size_t size) {
    while (size > 0 && carried_ > 0) {  // finish the word a previous piece began
      if (to != nullptr) *to++ = *from;
      carry_[carried_++] = *from++;
      --size;
      if (carried_ == 8) {
        word(load(carry_.data()));
        carried_ = 0;
      }
    }
    for (; size >= 8 && (words_ & 3) != 0; from += 8, size -= 8) {
      const std::uint64_t w = load(from);
      if (to != nullptr) {
        std::memcpy(to, &w, 8);
        to += 8;
      }
      word(w);
    }
    // The lanes in locals: the stores through `to` (a char*) may alias any member, which
    // would send every sum back to memory each word.
    std::uint64_t a0 = a_[0], a1 = a_[1], a2 = a_[2], a3 = a_[3];
    std::uint64_t b0 = b_[0], b1 = b_[1], b2 = b_[2], b3 = b_[3];
    const std::size_t blocks = size / 32;
    for (std::size_t i = 0; i < blocks; ++i, from += 32) {
      std::uint64_t w[4];
      std::memcpy(w, from, 32);
      if (to != nullptr) {
        std::memcpy(to, w, 32);
        to += 32;
      }
      a0 += w[0];
      a1 += w[1];
      a2 += w[2];
      a3 += w[3];
      b0 += a0;
      b1 += a1;
      b2 += a2;
      b3 += a3;
    }
    a_ = {a0, a1, a2, a3};
    b_ = {b0, b1, b2, b3};
    words_ += 4 * blocks;
    size -= 32 * blocks;
    for (; size >= 8; from += 8, size -= 8) {
      const std::uint64_t w = load(from);
      if (to != nullptr) {
        std::memcpy(to, &w, 8);
        to += 8;
      }
      word(w);
    }
    for (; size > 0; --size) {
      if (to != nullptr) *to++ = *from;
      carry_[carried_++] = *from++;
    }
  }
  std::uint64_t value() const {
    SlotSum last = *this;
    if (last.carried_ > 0) {
      std::fill(last.carry_.begin() + static_cast<std::ptrdiff_t>(last.carried_), last.carry_.end(),
                0);
      last.word(load(last.carry_.data()));
    }
    std::uint64_t hash = 0xcbf29ce484222325ULL ^ (words_ * 8 + carried_);
    for (int k = 0; k < 4; ++k) {
      hash = (hash ^ last.a_[k]) * 0x100000001b3ULL;
      hash = (hash ^ last.b_[k]) * 0x100000001b3ULL;
    }
    return hash;
  }

 private:
  static std::uint64_t load(const char* bytes) {
    std::uint64_t w;
    std::memcpy(&w, bytes, 8);
    return w;
  }
  void word(std::uint64_t w) {
    const auto k = words_++ & 3;
    a_[k] += w;
    b_[k] += a_[k];
  }
  std::array<std::uint64_t, 4> a_{}, b_{};
  std::uint64_t words_ = 0;
  std::array<char, 8> carry_{};
  std::size_t carried_ = 0;
};

[[noreturn]] void throw_errno(const std::string& what, int rank) {
  throw Error(std::error_code(errno, std::system_category()), what,
              {.rank = rank, .operation = "MemoryCheckpoints"});
}

// The fds braid-run hands this rank, from BRAID_SNAPSHOT_FDS ("7,8"); empty when unset.
std::vector<int> launcher_fds(int rank) {
  const std::string text = config::string_value("BRAID_SNAPSHOT_FDS");
  std::vector<int> fds;
  if (text.empty()) return fds;
  std::string_view rest = text;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    fds.push_back(static_cast<int>(
        config::parse_int(config::trim(rest.substr(0, comma)), "BRAID_SNAPSHOT_FDS")));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  if (fds.size() != 2 && fds.size() != 4) {
    throw Error(Errc::invalid_environment,
                fmt::format("BRAID_SNAPSHOT_FDS='{}' names {} file descriptors, not 2 or 4", text,
                            fds.size()),
                {.rank = rank, .operation = "MemoryCheckpoints"});
  }
  return fds;
}

// The partner's distance braid-run's environment implies: the local world size where the
// job spans several nodes of equal size and `comm` is the whole job; else none.
int partner_distance_from_launcher(int world) {
  const auto number = [](const char* name) {
    const char* text = std::getenv(name);
    return text != nullptr ? std::atoi(text) : 0;
  };
  const int nodes = number("BRAID_NNODES");
  const int local = number("BRAID_LOCAL_WORLD_SIZE");
  return nodes > 1 && local > 0 && nodes * local == world ? local : 0;
}

Buffer bytes_at(void* data, std::size_t size) {
  return Buffer(data, size, DType::u8);
}

}  // namespace

// One memfd, mapped whole; grown (never shrunk) to the state's size.
class MemoryCheckpoints::Slot {
 public:
  // Takes `fd` over, closing it if the slot cannot be made.
  Slot(int fd, int rank) : fd_(fd), rank_(rank) {
    try {
      struct stat info {};
      if (::fstat(fd_, &info) != 0) throw_errno("cannot stat a checkpoint slot", rank_);
      if (!S_ISREG(info.st_mode)) {
        throw Error(Errc::invalid_environment,
                    fmt::format("checkpoint slot fd {} is not a memfd", fd_),
                    {.rank = rank_, .operation = "MemoryCheckpoints"});
      }
      if (static_cast<std::size_t>(info.st_size) >= kHeaderBytes) {
        map(static_cast<std::size_t>(info.st_size));
      }
    } catch (...) {
      ::close(fd_);
      throw;
    }
  }
  ~Slot() {
    if (data_ != nullptr) ::munmap(data_, capacity_);
    ::close(fd_);
  }
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;

  void reserve(std::size_t bytes) {
    if (bytes <= capacity_) return;
    if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
      throw_errno(fmt::format("cannot grow a checkpoint slot to {} bytes", bytes), rank_);
    }
    map(bytes);
  }

  // Null until the slot has been written once.
  SlotHeader* header() const { return reinterpret_cast<SlotHeader*>(data_); }
  char* body() const { return data_ + kHeaderBytes; }
  std::size_t capacity() const { return capacity_; }

  SlotCondition condition() const {
    if (header() == nullptr || std::memcmp(header()->magic, kSlotMagic, 8) != 0) return kEmpty;
    return static_cast<SlotCondition>(
        std::atomic_ref(header()->condition).load(std::memory_order_acquire));
  }
  void set(SlotCondition condition) const {
    std::atomic_ref(header()->condition).store(condition, std::memory_order_release);
  }
  // The step it holds whole; -1 if none.
  std::int64_t whole_step() const { return condition() == kWhole ? header()->step : -1; }
  // Why its bytes are not what its header says (they run past the slot, or fail its sum);
  // null where they are.
  const char* damage() const {
    if (header()->length > capacity_ - kHeaderBytes) return "its length runs past its slot";
    SlotSum sum;
    sum.add(nullptr, body(), header()->length);
    return sum.value() == header()->sum ? nullptr : "its sum does not match its contents (damaged)";
  }

 private:
  void map(std::size_t bytes) {
    if (data_ != nullptr) ::munmap(data_, capacity_);
    void* at = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (at == MAP_FAILED) {
      data_ = nullptr;
      capacity_ = 0;
      throw_errno(fmt::format("cannot map a checkpoint slot of {} bytes", bytes), rank_);
    }
    data_ = static_cast<char*>(at);
    capacity_ = bytes;
  }

  int fd_;
  int rank_;
  char* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// Of two slots, the one to write next: not the one holding the newest whole copy (one
// being written or empty, else the older).
MemoryCheckpoints::Slot& MemoryCheckpoints::to_overwrite(
    const std::vector<std::unique_ptr<Slot>>& pair) {
  return pair[0]->whole_step() <= pair[1]->whole_step() ? *pair[0] : *pair[1];
}

MemoryCheckpoints::MemoryCheckpoints(std::shared_ptr<collectives::Communicator> comm,
                                     MemoryCheckpointOptions options)
    : comm_(std::move(comm)) {
  const int rank = comm_->rank();
  std::vector<int> given = options.slot_fds;
  const bool from_launcher = given.empty();
  if (from_launcher) given = launcher_fds(rank);
  held_by_launcher_ = !given.empty();
  if (!given.empty() && given.size() != 2 && given.size() != 4) {
    throw Error(
        Errc::invalid_argument,
        fmt::format("MemoryCheckpointOptions::slot_fds holds {} fds, not 2 or 4", given.size()),
        {.rank = rank, .operation = "MemoryCheckpoints"});
  }
  const int distance =
      options.partner_distance >= 0
          ? options.partner_distance
          : (given.size() == 4 ? partner_distance_from_launcher(comm_->size()) : 0);
  if (distance > 0 && given.size() != 4) {
    throw Error(
        Errc::invalid_argument,
        fmt::format("a partner (distance {}) needs four slot fds, not {}", distance, given.size()),
        {.rank = rank, .operation = "MemoryCheckpoints"});
  }
  if (distance % comm_->size() != 0) {
    distance_ = distance % comm_->size();
    partner_ = partner_of(rank);
    holds_for_ = (rank - distance_ + comm_->size()) % comm_->size();
  }
  for (std::size_t i = 0; i < (partner_ >= 0 ? 4U : 2U); ++i) {
    int fd = -1;
    if (given.empty()) {
      fd = ::memfd_create(fmt::format("braid-rank-{}-slot-{}", rank, i).c_str(), MFD_CLOEXEC);
      if (fd < 0) throw_errno("cannot make a memfd for a checkpoint slot", rank);
    } else {
      fd = ::fcntl(given[i], F_DUPFD_CLOEXEC, 3);
      if (fd < 0) {
        throw Error(Errc::invalid_environment,
                    fmt::format("checkpoint slot fd {} ({}) is not open: {}", given[i],
                                from_launcher ? "from BRAID_SNAPSHOT_FDS" : "slot_fds",
                                std::strerror(errno)),
                    {.rank = rank, .operation = "MemoryCheckpoints"});
      }
    }
    (i < 2 ? slots_ : partner_slots_).push_back(std::make_unique<Slot>(fd, rank));
  }
  // What braid-run passed stays open for this process only, not for what it starts.
  if (from_launcher) {
    for (int fd : given) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  copier_ = std::make_unique<BackgroundJob>();
}

MemoryCheckpoints::~MemoryCheckpoints() {
  // The last copy is not sent: the partner may be gone already (its job over), and a
  // finished job restarts from nothing.
  unsent_ = nullptr;
  try {
    wait();
  } catch (const std::exception& e) {
    log::warn("the last in-memory checkpoint was not copied: {}", e.what());
  }
}

void MemoryCheckpoints::save_async(const TrainingState& state) {
  wait();
  Slot& slot = to_overwrite(slots_);
  // Its own tensors whole, and its share of each replicated one (replicated_shares.hpp).
  TrainingState held = replicated_shares::split(state, comm_->rank(), comm_->size());
  const std::size_t length = checkpoint_format::encoded_size(held);
  slot.reserve(kHeaderBytes + length);
  SlotHeader& header = *slot.header();
  slot.set(kBeingWritten);
  std::memcpy(header.magic, kSlotMagic, sizeof kSlotMagic);
  header.rank = static_cast<std::uint32_t>(comm_->rank());
  header.world = static_cast<std::uint32_t>(comm_->size());
  header.step = state.step;
  header.length = length;
  // Host tensors are copied by the wait() before the step needs them, on the caller's
  // thread: where the ranks fill every core (CPU training) a thread of its own only adds a
  // scheduler's delay (ddp_train: 10.5 ms a step copied by the caller, 11.1-12.1 ms handed
  // over). A device's state is copied beside the step, on the checkpoints' thread.
  const bool on_device = std::any_of(held.tensors.begin(), held.tensors.end(),
                                     [](const auto& t) { return !t.second.device().is_cpu(); });
  if (partner_ >= 0) unsent_ = &slot;
  copier_->submit(
      [&slot, state = std::move(held), rank = comm_->rank(), world = comm_->size(), length] {
        char* at = slot.body();
        char* const end = at + length;
        SlotSum sum;
        bool halfway = false;
        checkpoint_format::Encoder out(
            [&](const char* data, std::size_t size) {
              if (size > static_cast<std::size_t>(end - at)) {
                throw Error(
                    Errc::size_mismatch,
                    fmt::format("the state of step {} grew while it was copied", state.step),
                    {.rank = rank, .operation = "MemoryCheckpoints"});
              }
              sum.add(at, data, size);
              at += size;
              if (!halfway && at - slot.body() >= static_cast<std::ptrdiff_t>(length / 2)) {
                halfway = true;
                fault_point(FaultPoint::memory_copy);
              }
            },
            /*checksummed=*/false);
        checkpoint_format::encode(out, state, rank, world);
        slot.header()->sum = sum.value();
        slot.set(kWhole);
      },
      /*start_now=*/on_device);
}

void MemoryCheckpoints::wait() {
  copier_->wait();
  if (Slot* mine = std::exchange(unsent_, nullptr)) exchange_with_partner(*mine);
}

// The partner slot to overwrite (not the one holding the newest whole copy), or the one
// holding `step` whole.
MemoryCheckpoints::Slot* MemoryCheckpoints::partner_slot_holding(std::int64_t step) {
  for (const auto& slot : partner_slots_) {
    if (slot->condition() == kWhole && slot->header()->step == step) return slot.get();
  }
  return nullptr;
}

// Sends this rank's newest copy to its partner and receives, into the older of its partner
// slots, the copy of the rank it holds for: headers first (each side learns the other's
// length), then the bytes. The receiving slot says "being written" until they are in.
void MemoryCheckpoints::exchange_with_partner(Slot& mine) {
  std::array<char, kHeaderBytes> theirs{};
  auto sent = comm_->launch(comm_->send(bytes_at(mine.header(), kHeaderBytes), partner_));
  comm_->launch(comm_->recv(bytes_at(theirs.data(), kHeaderBytes), holds_for_)).get();
  sent.get();
  SlotHeader header{};
  std::memcpy(&header, theirs.data(), sizeof header);
  if (std::memcmp(header.magic, kSlotMagic, 8) != 0 ||
      static_cast<int>(header.rank) != holds_for_ ||
      static_cast<int>(header.world) != comm_->size()) {
    throw Error(Errc::protocol_error,
                fmt::format("rank {} sent a copy that is not rank {}'s", holds_for_, holds_for_),
                {.rank = comm_->rank(), .peer = holds_for_, .operation = "MemoryCheckpoints"});
  }
  Slot& into = to_overwrite(partner_slots_);
  into.reserve(kHeaderBytes + header.length);
  into.set(kBeingWritten);
  SlotHeader& kept = *into.header();
  std::memcpy(kept.magic, kSlotMagic, sizeof kSlotMagic);
  kept.rank = header.rank;
  kept.world = header.world;
  kept.step = header.step;
  kept.length = header.length;
  kept.sum = header.sum;
  auto body_sent =
      comm_->launch(comm_->send(bytes_at(mine.body(), mine.header()->length), partner_));
  comm_->launch(comm_->recv(bytes_at(into.body(), header.length), holds_for_)).get();
  body_sent.get();
  into.set(kWhole);
}

int MemoryCheckpoints::partner_of(int rank) const {
  return distance_ == 0 ? -1 : (rank + distance_) % comm_->size();
}

std::vector<std::int64_t> MemoryCheckpoints::partner_steps() {
  wait();
  std::vector<std::int64_t> steps;
  for (const auto& slot : partner_slots_) {
    if (slot->condition() != kWhole) continue;
    if (const char* damage = slot->damage()) {
      log::warn("rank {}'s copy of rank {}'s step {} is refused: {}", comm_->rank(), holds_for_,
                slot->header()->step, damage);
      continue;
    }
    steps.push_back(slot->header()->step);
  }
  std::sort(steps.begin(), steps.end(), std::greater<>());
  return steps;
}

std::optional<TrainingState> MemoryCheckpoints::trade(std::int64_t step, bool mine_lost,
                                                      bool theirs_lost) {
  std::optional<Future<void>> sent;
  std::uint64_t length = 0;
  if (theirs_lost) {
    Slot* held = partner_slot_holding(step);
    if (held == nullptr) {
      throw Error(Errc::invalid_argument,
                  fmt::format("holds no copy of rank {}'s step {} to give back", holds_for_, step),
                  {.rank = comm_->rank(), .operation = "MemoryCheckpoints"});
    }
    length = held->header()->length;
    comm_->launch(comm_->send(bytes_at(&length, sizeof length), holds_for_)).get();
    sent = comm_->launch(comm_->send(bytes_at(held->body(), length), holds_for_));
  }
  std::optional<TrainingState> state;
  if (mine_lost) {
    std::uint64_t size = 0;
    comm_->launch(comm_->recv(bytes_at(&size, sizeof size), partner_)).get();
    std::string bytes(size, '\0');
    comm_->launch(comm_->recv(bytes_at(bytes.data(), size), partner_)).get();
    state = checkpoint_format::decode(bytes, comm_->rank(), comm_->size(), /*verify=*/false);
    if (state->step != step) {
      throw Error(Errc::protocol_error,
                  fmt::format("rank {} gave back step {}, not {}", partner_, state->step, step),
                  {.rank = comm_->rank(), .peer = partner_, .operation = "MemoryCheckpoints"});
    }
    replicated_shares::mark(*state);
  }
  if (sent) sent->get();
  return state;
}

std::optional<TrainingState> MemoryCheckpoints::restore() {
  auto restored = restore_newest(*comm_, this, nullptr);
  if (!restored) return std::nullopt;
  return std::move(restored->state);
}

std::map<std::int64_t, TrainingState, std::greater<>> MemoryCheckpoints::readable() {
  wait();
  std::map<std::int64_t, TrainingState, std::greater<>> read;
  for (const auto& slot : slots_) {
    const SlotCondition condition = slot->condition();
    if (condition == kEmpty) continue;
    const SlotHeader& header = *slot->header();
    const std::string what =
        fmt::format("rank {}'s in-memory copy of step {}", comm_->rank(), header.step);
    if (condition == kBeingWritten) {
      log::warn("{} is refused: its process stopped while copying it", what);
      continue;
    }
    if (static_cast<int>(header.world) != comm_->size()) {
      // Made before the job changed size (braid-run --nnodes MIN:MAX): its shares split the
      // state another way. The disk's files of that size serve instead (restore_newest).
      log::info("{} was made by a job of {} rank(s), not {}: not used", what, header.world,
                comm_->size());
      continue;
    }
    try {
      if (const char* damage = slot->damage()) throw std::runtime_error(damage);
      TrainingState state = checkpoint_format::decode(std::string_view(slot->body(), header.length),
                                                      comm_->rank(), comm_->size(),
                                                      /*verify=*/false);
      // The header is outside the sum: it must agree with what it describes, as slot
      // choice and forget_after() go by it.
      if (state.step != header.step || static_cast<int>(header.rank) != comm_->rank() ||
          static_cast<int>(header.world) != comm_->size()) {
        throw std::runtime_error("its header does not match its contents");
      }
      replicated_shares::mark(state);
      read[state.step] = std::move(state);
    } catch (const std::exception& e) {
      log::warn("{} is refused: {}", what, e.what());
    }
  }
  return read;
}

void MemoryCheckpoints::forget_after(std::int64_t step) {
  wait();
  for (const auto* slots : {&slots_, &partner_slots_}) {
    for (const auto& slot : *slots) {
      if (slot->condition() != kEmpty && slot->header()->step > step) slot->set(kEmpty);
    }
  }
}

std::size_t MemoryCheckpoints::bytes() const {
  std::size_t total = 0;
  for (const auto* slots : {&slots_, &partner_slots_}) {
    for (const auto& slot : *slots) total += slot->capacity();
  }
  return total;
}

}  // namespace braid::torch
