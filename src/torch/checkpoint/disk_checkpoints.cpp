#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include <braid/core/error.hpp>
#include <braid/core/fault_points.hpp>
#include <braid/core/log.hpp>
#include <braid/torch/checkpoint/disk_checkpoints.hpp>
#include <braid/torch/checkpoint/restore_newest.hpp>

#include "background_job.hpp"
#include "checkpoint_format.hpp"
#include "replicated_shares.hpp"

namespace braid::torch {
namespace fs = std::filesystem;
namespace {

// At most this many steps each rank offers restore(); keep is clamped to it.
constexpr int kMostKept = 8;

[[noreturn]] void throw_errno(const std::string& what) {
  throw Error(std::error_code(errno, std::system_category()), what,
              {.operation = "checkpoint.save"});
}

// Temporary name, write, fsync, rename, fsync the directory: the file appears whole or not
// at all.
void write_atomically(const fs::path& path, const TrainingState& state, int rank, int world) {
  fs::create_directories(path.parent_path());
  const fs::path partial = path.string() + fmt::format(".partial.{}", ::getpid());
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno(fmt::format("cannot create {}", partial.string()));
  try {
    const std::size_t half = checkpoint_format::encoded_size(state) / 2;
    std::size_t written = 0;
    checkpoint_format::Encoder out([&](const char* data, std::size_t size) {
      if (written < half && written + size >= half) fault_point(FaultPoint::disk_write);
      written += size;
      while (size > 0) {
        const ssize_t n = ::write(fd, data, size);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno(fmt::format("cannot write {}", partial.string()));
        data += n;
        size -= static_cast<std::size_t>(n);
      }
    });
    checkpoint_format::encode(out, state, rank, world);
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

// Removes this rank's file of `step`, and the step's directory once no rank's file is left.
void remove_own(const DiskCheckpoints& checkpoints, std::int64_t step) {
  std::error_code ignored;
  fs::remove(checkpoints.file_of(step), ignored);
  fs::remove(checkpoints.file_of(step).parent_path(), ignored);  // only once it is empty
}

}  // namespace

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
  writer_ = std::make_unique<BackgroundJob>();
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
  // The snapshot: host copies the next step's updates cannot reach, of this rank's own
  // tensors and its shares of the replicated ones (replicated_shares.hpp).
  const TrainingState held = replicated_shares::split(state, comm_->rank(), comm_->size());
  auto snapshot = std::make_shared<TrainingState>();
  snapshot->step = held.step;
  snapshot->blobs = held.blobs;
  for (const auto& [name, tensor] : held.tensors) {
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
      remove_own(*this, steps[i]);
    }
  });
}

void DiskCheckpoints::wait() {
  writer_->wait();
}

std::optional<TrainingState> DiskCheckpoints::restore() {
  auto restored = restore_newest(*comm_, nullptr, this);
  if (!restored) return std::nullopt;
  return std::move(restored->state);
}

std::map<std::int64_t, TrainingState, std::greater<>> DiskCheckpoints::readable() {
  wait();
  // This rank's files, newest first; and away with the files a process of this rank was
  // writing when it died (they are no checkpoint, and would pile up restart after restart).
  std::map<std::int64_t, TrainingState, std::greater<>> read;
  for (std::int64_t step : own_steps(directory_, *this, /*remove_torn=*/true)) {
    if (read.size() == kMostKept) break;
    try {
      read[step] =
          checkpoint_format::decode(read_file(file_of(step)), comm_->rank(), comm_->size());
      replicated_shares::mark(read[step]);
    } catch (const std::exception& e) {
      log::warn("checkpoint {} is refused: {}", file_of(step).string(), e.what());
    }
  }
  return read;
}

void DiskCheckpoints::forget_after(std::int64_t step) {
  wait();
  for (std::int64_t held : own_steps(directory_, *this, /*remove_torn=*/false)) {
    if (held <= step) break;
    remove_own(*this, held);
  }
}

std::optional<std::pair<std::int64_t, int>> DiskCheckpoints::newest_of_another_size() {
  wait();
  std::optional<std::pair<std::int64_t, int>> newest;
  for (const auto& entry : fs::directory_iterator(directory_)) {
    const auto step = step_of_directory(entry.path());
    if (!step || (newest && *step <= newest->first)) continue;
    // The ranks each world size wrote this step for.
    std::map<int, std::set<int>> written;
    for (const auto& file : fs::directory_iterator(entry.path())) {
      int rank = 0, world = 0;
      char end = 0;
      if (std::sscanf(file.path().filename().c_str(), "rank-%5d-of-%5d.ckp%c", &rank, &world,
                      &end) == 3 &&
          end == 't' && file.path().filename().string().size() == 24 && world != comm_->size() &&
          rank >= 0 && rank < world) {
        written[world].insert(rank);
      }
    }
    for (const auto& [world, ranks] : written) {
      if (static_cast<int>(ranks.size()) == world) newest = {*step, world};
    }
  }
  return newest;
}

TrainingState DiskCheckpoints::read_whole(std::int64_t step, int ranks, int own_from) {
  std::vector<TrainingState> shares;
  for (int r = 0; r < ranks; ++r) {
    const fs::path file = directory_ / fmt::format("step-{:08}", step) /
                          fmt::format("rank-{:05}-of-{:05}.ckpt", r, ranks);
    try {
      shares.push_back(checkpoint_format::decode(read_file(file), r, ranks));
    } catch (const std::exception& e) {
      throw Error(Errc::invalid_argument,
                  fmt::format("checkpoint {} is refused: {}", file.string(), e.what()),
                  {.rank = comm_->rank(), .operation = "restore"});
    }
    replicated_shares::mark(shares.back());
  }
  return replicated_shares::join(std::move(shares), own_from);
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
