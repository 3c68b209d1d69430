#include <algorithm>
#include <array>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include <braid/core/buffer.hpp>
#include <braid/core/error.hpp>
#include <braid/core/log.hpp>
#include <braid/torch/checkpoint/disk_checkpoints.hpp>

namespace braid::torch {
namespace fs = std::filesystem;
namespace {

// The file: magic, a header, entries, and a checksum of everything before it.
//   "BRAIDCK1" | u64 step | u32 rank | u32 world | u32 entries |
//   entry: u8 kind (0 tensor, 1 blob) | u32 name length | name |
//     tensor: i32 scalar type | u32 dims | i64 dims... | u64 bytes | bytes
//     blob:   u64 bytes | bytes
//   | u64 checksum
constexpr char kMagic[8] = {'B', 'R', 'A', 'I', 'D', 'C', 'K', '1'};
// At most this many steps each rank offers restore(); keep is clamped to it.
constexpr int kMostKept = 8;

// FNV-1a over 8-byte words (and the tail bytewise), fed in pieces of any size: fast enough
// to run at disk speed, and any torn or flipped byte changes it. Not a defence against
// tampering.
class Checksum {
 public:
  void add(const char* data, std::size_t size) {
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
  std::uint64_t value() const {
    std::uint64_t hash = hash_;
    for (std::size_t i = 0; i < carried_; ++i) {
      hash = (hash ^ static_cast<unsigned char>(carry_[i])) * kPrime;
    }
    return hash;
  }

 private:
  static constexpr std::uint64_t kPrime = 0x100000001b3ULL;
  void word(const char* bytes) {
    std::uint64_t w;
    std::memcpy(&w, bytes, 8);
    hash_ = (hash_ ^ w) * kPrime;
  }
  std::uint64_t hash_ = 0xcbf29ce484222325ULL;
  std::array<char, 8> carry_{};
  std::size_t carried_ = 0;
};

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

[[noreturn]] void throw_errno(const std::string& what) {
  throw Error(std::error_code(errno, std::system_category()), what,
              {.operation = "checkpoint.save"});
}

// Writes pieces to a file as they come, through a small buffer for the headers and
// straight from the tensors' memory for their bytes, checksumming all of it: the state is
// never copied into one string.
class FileWriter {
 public:
  FileWriter(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  void small(std::string_view bytes) {
    buffer_.append(bytes);
    if (buffer_.size() >= kBuffer) flush();
  }
  void large(const char* data, std::size_t size) {
    flush();
    raw(data, size);
  }
  void flush() {
    raw(buffer_.data(), buffer_.size());
    buffer_.clear();
  }
  const Checksum& checksum() const { return checksum_; }

 private:
  static constexpr std::size_t kBuffer = 64 << 10;
  void raw(const char* data, std::size_t size) {
    checksum_.add(data, size);
    while (size > 0) {
      const ssize_t n = ::write(fd_, data, size);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_errno(fmt::format("cannot write {}", name_));
      data += n;
      size -= static_cast<std::size_t>(n);
    }
  }
  int fd_;
  std::string name_;
  std::string buffer_;
  Checksum checksum_;
};

void encode(FileWriter& out, const TrainingState& state, int rank, int world) {
  std::string head(kMagic, sizeof kMagic);
  put<std::int64_t>(head, state.step);
  put<std::uint32_t>(head, static_cast<std::uint32_t>(rank));
  put<std::uint32_t>(head, static_cast<std::uint32_t>(world));
  put<std::uint32_t>(head, static_cast<std::uint32_t>(state.tensors.size() + state.blobs.size()));
  out.small(head);
  for (const auto& [name, tensor] : state.tensors) {
    std::string entry;
    put<std::uint8_t>(entry, 0);
    put<std::uint32_t>(entry, static_cast<std::uint32_t>(name.size()));
    entry.append(name);
    put<std::int32_t>(entry, static_cast<std::int32_t>(tensor.scalar_type()));
    put<std::uint32_t>(entry, static_cast<std::uint32_t>(tensor.dim()));
    for (std::int64_t d : tensor.sizes()) put<std::int64_t>(entry, d);
    put<std::uint64_t>(entry, tensor.nbytes());
    out.small(entry);
    out.large(static_cast<const char*>(tensor.const_data_ptr()), tensor.nbytes());
  }
  for (const auto& [name, bytes] : state.blobs) {
    std::string entry;
    put<std::uint8_t>(entry, 1);
    put<std::uint32_t>(entry, static_cast<std::uint32_t>(name.size()));
    entry.append(name);
    put<std::uint64_t>(entry, bytes.size());
    out.small(entry);
    out.large(bytes.data(), bytes.size());
  }
  out.flush();
  std::string tail;
  put<std::uint64_t>(tail, out.checksum().value());
  out.large(tail.data(), tail.size());
}

// Reads what encode() wrote; std::runtime_error saying what is wrong with it.
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

TrainingState decode(std::string_view bytes, int rank, int world) {
  if (bytes.size() < sizeof kMagic + 8 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    throw std::runtime_error("it is not a braid checkpoint (no BRAIDCK1 header)");
  }
  const std::string_view body = bytes.substr(0, bytes.size() - 8);
  std::uint64_t stored;
  std::memcpy(&stored, bytes.data() + body.size(), 8);
  Checksum computed;
  computed.add(body.data(), body.size());
  if (computed.value() != stored) {
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

// Temporary name, write, fsync, rename, fsync the directory: the file appears whole or not
// at all.
void write_atomically(const fs::path& path, const TrainingState& state, int rank, int world) {
  fs::create_directories(path.parent_path());
  const fs::path partial = path.string() + fmt::format(".partial.{}", ::getpid());
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno(fmt::format("cannot create {}", partial.string()));
  try {
    FileWriter out(fd, partial.string());
    encode(out, state, rank, world);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    throw_errno(fmt::format("cannot flush {}", partial.string()));
  }
  if (::rename(partial.c_str(), path.c_str()) != 0) {
    throw_errno(fmt::format("cannot rename {} to {}", partial.string(), path.string()));
  }
  const int dir = ::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("it cannot be opened");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return std::move(bytes).str();
}

std::optional<std::int64_t> step_of_directory(const fs::path& path) {
  const std::string name = path.filename().string();
  if (!name.starts_with("step-")) return std::nullopt;
  try {
    std::size_t used = 0;
    const std::int64_t step = std::stoll(name.substr(5), &used);
    if (used != name.size() - 5 || step < 0) return std::nullopt;
    return step;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The steps whose file `checkpoints` (this rank) holds under `directory`, newest first;
// with `remove_torn`, its files left half-written by a process that died go first.
std::vector<std::int64_t> own_steps(const fs::path& directory, const DiskCheckpoints& checkpoints,
                                    bool remove_torn) {
  std::vector<std::int64_t> steps;
  for (const auto& entry : fs::directory_iterator(directory)) {
    const auto step = step_of_directory(entry.path());
    if (!step) continue;
    const fs::path mine = checkpoints.file_of(*step);
    if (remove_torn) {
      const std::string torn = mine.filename().string() + ".partial.";
      for (const auto& file : fs::directory_iterator(entry.path())) {
        if (file.path().filename().string().starts_with(torn)) {
          std::error_code ignored;
          fs::remove(file.path(), ignored);
        }
      }
    }
    if (fs::exists(mine)) steps.push_back(*step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

}  // namespace

// One background thread writing one snapshot at a time.
class DiskCheckpoints::Writer {
 public:
  Writer() : thread_([this] { loop(); }) {}
  ~Writer() {
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  // Waits for the job before, then hands this one over.
  void submit(std::function<void()> job) {
    wait();
    std::lock_guard lock(mutex_);
    job_ = std::move(job);
    changed_.notify_all();
  }

  void wait() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !job_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return job_ || closing_; });
      if (!job_) return;
      lock.unlock();
      std::exception_ptr error;
      try {
        job_();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      job_ = nullptr;
      if (error) error_ = error;
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> job_;
  std::exception_ptr error_;
  bool closing_ = false;
  std::thread thread_;
};

DiskCheckpoints::DiskCheckpoints(fs::path directory,
                                 std::shared_ptr<collectives::Communicator> comm,
                                 DiskCheckpointOptions options)
    : directory_(std::move(directory)), comm_(std::move(comm)), options_(options) {
  if (options_.keep < 2 || options_.keep > kMostKept) {
    throw Error(Errc::invalid_argument,
                fmt::format("DiskCheckpointOptions::keep={} is not 2 to {}: a step is complete "
                            "only once every rank has written it, so each keeps two at least",
                            options_.keep, kMostKept),
                {.rank = comm_->rank(), .operation = "DiskCheckpoints"});
  }
  fs::create_directories(directory_);
  writer_ = std::make_unique<Writer>();
}

DiskCheckpoints::~DiskCheckpoints() {
  try {
    writer_->wait();
  } catch (const std::exception& e) {
    log::warn("the last checkpoint was not written: {}", e.what());
  }
}

fs::path DiskCheckpoints::file_of(std::int64_t step) const {
  return directory_ / fmt::format("step-{:08}", step) /
         fmt::format("rank-{:05}-of-{:05}.ckpt", comm_->rank(), comm_->size());
}

void DiskCheckpoints::save_async(const TrainingState& state) {
  // The snapshot: host copies the next step's updates cannot reach.
  auto snapshot = std::make_shared<TrainingState>();
  snapshot->step = state.step;
  snapshot->blobs = state.blobs;
  for (const auto& [name, tensor] : state.tensors) {
    snapshot->tensors[name] =
        tensor.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
  }
  const int rank = comm_->rank();
  const int world = comm_->size();
  const fs::path path = file_of(state.step);
  writer_->submit([this, snapshot, rank, world, path] {
    write_atomically(path, *snapshot, rank, world);
    // This rank's files beyond the newest `keep`: its own only, never another rank's.
    const std::vector<std::int64_t> steps = own_steps(directory_, *this, /*remove_torn=*/false);
    for (std::size_t i = static_cast<std::size_t>(options_.keep); i < steps.size(); ++i) {
      std::error_code ignored;
      fs::remove(file_of(steps[i]), ignored);
      fs::remove(file_of(steps[i]).parent_path(), ignored);  // only once it is empty
    }
  });
}

void DiskCheckpoints::wait() {
  writer_->wait();
}

std::optional<TrainingState> DiskCheckpoints::restore() {
  wait();
  // This rank's files, newest first (the whole ones are read below, up to kMostKept); and
  // away with the files a process of this rank was writing when it died (they are no
  // checkpoint, and would pile up restart after restart).
  const std::vector<std::int64_t> steps = own_steps(directory_, *this, /*remove_torn=*/true);
  std::vector<std::int64_t> whole(kMostKept, -1);
  std::map<std::int64_t, TrainingState> read;
  std::size_t found = 0;
  for (std::int64_t step : steps) {
    if (found == whole.size()) break;
    try {
      read[step] = decode(read_file(file_of(step)), comm_->rank(), comm_->size());
      whole[found++] = step;
    } catch (const std::exception& e) {
      log::warn("checkpoint {} is refused: {}", file_of(step).string(), e.what());
    }
  }
  // Every rank's list; the newest step on all of them.
  std::vector<std::int64_t> all(whole.size() * static_cast<std::size_t>(comm_->size()));
  comm_->launch(comm_->all_gather(Buffer(whole), Buffer(all))).get();
  std::optional<std::int64_t> chosen;
  for (std::int64_t step : whole) {
    if (step < 0) break;
    bool everywhere = true;
    for (int r = 0; r < comm_->size() && everywhere; ++r) {
      const auto begin = all.begin() + static_cast<std::ptrdiff_t>(r * whole.size());
      everywhere = std::find(begin, begin + static_cast<std::ptrdiff_t>(whole.size()), step) !=
                   begin + static_cast<std::ptrdiff_t>(whole.size());
    }
    if (everywhere) {
      chosen = step;
      break;
    }
  }
  if (!chosen) return std::nullopt;
  if (!read.contains(*chosen)) {
    read[*chosen] = decode(read_file(file_of(*chosen)), comm_->rank(), comm_->size());
  }
  return std::move(read[*chosen]);
}

namespace {

// A parameter's state under its group and place: "<prefix>.<group>.<index>.<what>".
std::string state_name(const std::string& prefix, std::size_t group, std::size_t index,
                       std::string_view what) {
  return fmt::format("{}.{}.{}.{}", prefix, group, index, what);
}

// The state's tensors of one parameter, by what they hold; empty where the optimizer's
// state is of a kind kept only as its archive.
std::optional<std::map<std::string, at::Tensor*>> state_tensors(
    ::torch::optim::OptimizerParamState& state, std::int64_t*& step) {
  step = nullptr;
  if (auto* adam = dynamic_cast<::torch::optim::AdamParamState*>(&state)) {
    step = &adam->step();
    return std::map<std::string, at::Tensor*>{{"exp_avg", &adam->exp_avg()},
                                              {"exp_avg_sq", &adam->exp_avg_sq()},
                                              {"max_exp_avg_sq", &adam->max_exp_avg_sq()}};
  }
  if (auto* adamw = dynamic_cast<::torch::optim::AdamWParamState*>(&state)) {
    step = &adamw->step();
    return std::map<std::string, at::Tensor*>{{"exp_avg", &adamw->exp_avg()},
                                              {"exp_avg_sq", &adamw->exp_avg_sq()},
                                              {"max_exp_avg_sq", &adamw->max_exp_avg_sq()}};
  }
  if (auto* sgd = dynamic_cast<::torch::optim::SGDParamState*>(&state)) {
    return std::map<std::string, at::Tensor*>{{"momentum_buffer", &sgd->momentum_buffer()}};
  }
  return std::nullopt;
}

// A fresh state of the optimizer's kind, to fill from a checkpoint.
std::unique_ptr<::torch::optim::OptimizerParamState> new_state(
    ::torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<::torch::optim::Adam*>(&optimizer)) {
    return std::make_unique<::torch::optim::AdamParamState>();
  }
  if (dynamic_cast<::torch::optim::AdamW*>(&optimizer)) {
    return std::make_unique<::torch::optim::AdamWParamState>();
  }
  if (dynamic_cast<::torch::optim::SGD*>(&optimizer)) {
    return std::make_unique<::torch::optim::SGDParamState>();
  }
  return nullptr;
}

std::string archive_bytes(::torch::optim::Optimizer& optimizer) {
  ::torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return std::move(out).str();
}

}  // namespace

void save_optimizer(::torch::optim::Optimizer& optimizer, TrainingState& state,
                    const std::string& prefix) {
  TrainingState mine;
  const bool by_tensors = new_state(optimizer) != nullptr;
  auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size() && by_tensors; ++g) {
    // Hexadecimal: the double exactly.
    mine.blobs[fmt::format("{}.{}.lr", prefix, g)] =
        fmt::format("{:a}", groups[g].options().get_lr());
    const auto& params = groups[g].params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto found = optimizer.state().find(params[i].unsafeGetTensorImpl());
      if (found == optimizer.state().end()) continue;  // not stepped yet
      std::int64_t* step = nullptr;
      auto tensors = state_tensors(*found->second, step);
      if (!tensors) break;
      if (step != nullptr) {
        mine.tensors[state_name(prefix, g, i, "step")] = at::scalar_tensor(*step, at::kLong);
      }
      for (const auto& [what, tensor] : *tensors) {
        if (tensor->defined()) mine.tensors[state_name(prefix, g, i, what)] = *tensor;
      }
    }
  }
  if (!by_tensors) {
    state.blobs[prefix] = archive_bytes(optimizer);
    return;
  }
  state.tensors.merge(mine.tensors);
  state.blobs.merge(mine.blobs);
}

void load_optimizer(::torch::optim::Optimizer& optimizer, const TrainingState& state,
                    const std::string& prefix) {
  if (auto archive = state.blobs.find(prefix); archive != state.blobs.end()) {
    ::torch::serialize::InputArchive in;
    std::istringstream bytes(archive->second);
    in.load_from(bytes);
    optimizer.load(in);
    return;
  }
  if (!new_state(optimizer)) {
    throw std::invalid_argument(
        fmt::format("the checkpoint of step {} holds no state for this optimizer under '{}'",
                    state.step, prefix));
  }
  auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto lr = state.blobs.find(fmt::format("{}.{}.lr", prefix, g));
    if (lr == state.blobs.end()) {
      throw std::invalid_argument(fmt::format(
          "the checkpoint of step {} holds no parameter group {} under '{}': another optimizer "
          "or layout saved it",
          state.step, g, prefix));
    }
    groups[g].options().set_lr(std::strtod(lr->second.c_str(), nullptr));
    const auto& params = groups[g].params();
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto fresh = new_state(optimizer);
      std::int64_t* step = nullptr;
      auto tensors = *state_tensors(*fresh, step);
      bool any = false;
      if (step != nullptr) {
        if (auto t = state.tensors.find(state_name(prefix, g, i, "step"));
            t != state.tensors.end()) {
          *step = t->second.item<std::int64_t>();
          any = true;
        }
      }
      for (const auto& [what, tensor] : tensors) {
        auto t = state.tensors.find(state_name(prefix, g, i, what));
        if (t == state.tensors.end()) continue;
        if (!t->second.sizes().equals(params[i].sizes())) {
          throw std::invalid_argument(fmt::format(
              "the checkpoint of step {} holds {} of shape {} for a parameter of shape {}",
              state.step, t->first, t->second.sizes(), params[i].sizes()));
        }
        *tensor = t->second.to(params[i].device(), params[i].scalar_type(), false, true);
        any = true;
      }
      if (any) optimizer.state()[params[i].unsafeGetTensorImpl()] = std::move(fresh);
    }
  }
}

std::string cpu_generator_bytes() {
  const at::Tensor state = at::detail::getDefaultCPUGenerator().get_state();
  return std::string(static_cast<const char*>(state.const_data_ptr()), state.nbytes());
}

void load_cpu_generator_bytes(const std::string& bytes) {
  at::Tensor state = at::empty({static_cast<std::int64_t>(bytes.size())}, at::kByte);
  std::memcpy(state.mutable_data_ptr(), bytes.data(), bytes.size());
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace braid::torch
