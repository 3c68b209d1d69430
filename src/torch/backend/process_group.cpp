// braid::torch::ProcessGroup's collectives (process_group.hpp): each checks its tensors,
// calls the communicator on the caller's thread (which takes the call's place in the
// order) and hands the awaitable to start(), which completes a Work from the progress
// thread. Joining is in process_group_join.cpp.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <c10/util/Exception.h>

#include <braid/build_config.hpp>
#include <braid/core/error.hpp>
#include <braid/torch/backend/process_group.hpp>
#include <braid/torch/tensor_buffer.hpp>

#include "torch/cuda_current_stream.hpp"

namespace braid::torch {

namespace {

// A Work that follows a c10::ivalue::Future. PyTorch's own Work::create_from_future does
// not rethrow from wait(), and refuses a finite timeout; this one does both.
class FutureWork final : public c10d::Work {
 public:
  FutureWork(int rank, c10d::OpType type, c10::intrusive_ptr<c10::ivalue::Future> future)
      : Work(rank, type), future_(std::move(future)) {}

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override { return future_->exception_ptr(); }
  std::vector<at::Tensor> result() override { return future_->value().toTensorVector(); }

  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout != kNoTimeout) {
      // c10's Future has no timed wait; the operation's own deadline (join()'s timeout)
      // bounds an untimed one.
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      while (!future_->completed()) {
        TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "braid rank ", rank_, ": ",
                    c10d::opTypeToString(opType_), " did not complete within ", timeout.count(),
                    " ms");
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    future_->waitAndThrow();
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

std::string prefix(int rank, std::string_view op) {
  return c10::str("braid rank ", rank, ": ", op, ": ");
}

// Runs on the progress thread: awaits the operation, finishes, completes the future.
}  // namespace

struct ProcessGroup::Remains {
  struct Operation {
    c10::intrusive_ptr<c10::ivalue::Future> future;
    std::vector<at::Tensor> outputs;
    std::function<void()> finish;
  };
  std::mutex mutex;
  std::vector<Operation> finished;

  void keep(Operation operation) {
    std::lock_guard lock(mutex);
    finished.push_back(std::move(operation));
  }
  // On a caller's thread.
  void release() {
    std::vector<Operation> done;
    {
      std::lock_guard lock(mutex);
      done.swap(finished);
    }
  }
};

// Completions, one callback chain running at a time, in the order the operations were
// issued among those that have completed. A job is an operation's completion: marking its
// future completed, which runs the callbacks chained on it (then()) on the job's thread. A
// callback may issue operations of its own and wait for them (PowerSGD's hook does, once per
// bucket), so every job gets a thread when all are busy: a callback that waits never holds
// up the completion it waits for.
//
// The order is what makes callbacks that issue operations safe: every rank must issue a
// group's operations in one order, and callbacks racing on threads would issue theirs in
// whatever order the threads ran (PowerSGD's P and Q all-reduces of two buckets crossed).
// So a job waits for the turn: no other callback running. The turn passes on when the
// job's thread issues an operation on any braid group (it is about to wait for it) or
// returns; when an operation a callback issued completes, the turn goes back to that
// callback's thread, which wakes to go on, until it issues again or returns. A completed
// job never waits for an earlier operation still running (an irecv posted early must not
// hold up the collectives after it). A holder that does neither within kTurnTimeout is
// waiting for something else (an operation of the training thread's), and the next job goes
// ahead: no pattern deadlocks, and only such callbacks are left to the threads' order.
// Threads are detached and own this state, so no one joins them: a group destroyed on
// Python's thread, holding the GIL, never waits for a thread that needs it. Cost: a hand-off
// between threads per operation.
struct ProcessGroup::Completions : std::enable_shared_from_this<Completions> {
  // A thread idle this long leaves; the next operation starts one again (tens of us).
  static constexpr auto kIdleExit = std::chrono::seconds(2);
  static constexpr auto kTurnTimeout = std::chrono::milliseconds(500);

  // A job's thread, while its job runs; callbacks of the job issue on it. `issues` counts
  // what it issued, so a completion hands the turn back only to a callback still waiting.
  struct Runner {
    bool running = true;
    std::uint64_t issues = 0;
  };
  struct Job {
    std::function<void()> run;
    std::shared_ptr<Runner> issuer;   // the job whose thread issued the operation, if any
    std::uint64_t issuer_issues = 0;  // its count of issues then
  };

  std::mutex mutex;
  std::condition_variable wake;
  std::map<std::uint64_t, Job> done;  // completed operations by ticket, not yet delivered
  std::uint64_t next_ticket = 0;
  std::shared_ptr<Runner> turn;  // who runs now; null: the turn is free
  std::chrono::steady_clock::time_point turn_since;
  std::size_t idle = 0;

  // The job this thread runs, and whose Completions; the job keeps that alive.
  static thread_local std::pair<Completions*, std::shared_ptr<Runner>> current;

  // At issue, on the issuing thread: the operation's ticket, the job issuing it (on a job's
  // thread of this group) and that job's count of issues. A job issuing on any braid group
  // gives up its own group's turn: it waits for what it issued, not for that group.
  struct Issued {
    std::uint64_t ticket;
    std::shared_ptr<Runner> issuer;
    std::uint64_t issuer_issues;
  };
  Issued issue() {
    auto [owner, runner] = current;
    if (owner != nullptr && owner != this) {
      std::lock_guard lock(owner->mutex);
      owner->count_issue(*runner);
    }
    std::lock_guard lock(mutex);
    Issued issued{next_ticket++, owner == this ? runner : nullptr, 0};
    if (issued.issuer) issued.issuer_issues = count_issue(*issued.issuer);
    return issued;
  }

  // Under `mutex`: `runner` issued an operation; it gives up the turn if it held it.
  std::uint64_t count_issue(Runner& runner) {
    if (turn.get() == &runner) {
      turn = nullptr;
      wake.notify_all();
    }
    return ++runner.issues;
  }

  // On the progress thread, once the operation has ended.
  void post(const Issued& issued, std::function<void()> run) {
    std::lock_guard lock(mutex);
    done.emplace(issued.ticket, Job{std::move(run), issued.issuer, issued.issuer_issues});
    if (done.size() > idle) {
      std::thread([self = shared_from_this()] { self->work(); }).detach();
    } else {
      wake.notify_all();
    }
  }

  void work() {
    std::unique_lock lock(mutex);
    for (;;) {
      ++idle;
      const auto idle_since = std::chrono::steady_clock::now();
      for (;;) {
        const auto now = std::chrono::steady_clock::now();
        if (!done.empty()) {
          if (turn && now - turn_since >= kTurnTimeout) turn = nullptr;  // it waits elsewhere
          if (!turn) break;
          wake.wait_until(lock, turn_since + kTurnTimeout);
        } else if (now - idle_since >= kIdleExit) {
          --idle;
          return;
        } else {
          wake.wait_until(lock, idle_since + kIdleExit);
        }
      }
      --idle;
      auto node = done.extract(done.begin());  // the earliest issued of those completed
      Job job = std::move(node.mapped());
      auto runner = std::make_shared<Runner>();
      turn = runner;
      turn_since = std::chrono::steady_clock::now();
      lock.unlock();
      current = {this, runner};
      job.run();
      job.run = nullptr;
      current = {nullptr, nullptr};
      lock.lock();
      runner->running = false;
      if (turn == runner) {
        // Nothing issued: the turn goes back to the callback that issued this operation,
        // which its completion woke, if it has issued nothing since (it waits for this).
        const bool waiting =
            job.issuer && job.issuer->running && job.issuer->issues == job.issuer_issues;
        turn = waiting ? job.issuer : nullptr;
        turn_since = std::chrono::steady_clock::now();
      }
      wake.notify_all();
    }
  }
};

thread_local std::pair<ProcessGroup::Completions*,
                       std::shared_ptr<ProcessGroup::Completions::Runner>>
    ProcessGroup::Completions::current{nullptr, nullptr};

namespace {

asio::awaitable<void> complete(asio::awaitable<void> operation,
                               c10::intrusive_ptr<c10::ivalue::Future> future,
                               std::vector<at::Tensor> outputs, std::function<void()> finish,
                               std::string what, std::shared_ptr<ProcessGroup::Remains> remains,
                               std::shared_ptr<ProcessGroup::Completions> completions,
                               ProcessGroup::Completions::Issued issued) {
  std::exception_ptr error;
  try {
    co_await std::move(operation);
    if (finish) finish();
  } catch (const c10::Error&) {
    error = std::current_exception();
  } catch (const std::exception& e) {
    error = std::make_exception_ptr(c10::Error({__func__, __FILE__, __LINE__}, what + e.what()));
  } catch (...) {
    error = std::make_exception_ptr(
        c10::Error({__func__, __FILE__, __LINE__}, what + "failed with an unknown exception"));
  }
  // On a completion thread, where callbacks chained with then() may wait; their errors are
  // theirs.
  completions->post(
      issued, [future = std::move(future), outputs = std::move(outputs), finish = std::move(finish),
               error, remains = std::move(remains)]() mutable {
        if (error) {
          future->setError(error);
        } else {
          future->markCompleted(c10::IValue(outputs));
        }
        remains->keep({std::move(future), std::move(outputs), std::move(finish)});
      });
}

// The coalesced forms' operations, already in the communicator's order, awaited in turn.
asio::awaitable<void> one_after_another(std::vector<asio::awaitable<void>> operations) {
  for (asio::awaitable<void>& operation : operations) co_await std::move(operation);
}

// recv's awaitable reports the elements received; PyTorch expects the whole tensor.
asio::awaitable<void> receive_exactly(asio::awaitable<std::size_t> receive, std::size_t count,
                                      std::string what) {
  const std::size_t received = co_await std::move(receive);
  TORCH_CHECK(received == count, what, "received ", received, " elements into a tensor of ", count,
              "; the sender's tensor must have as many");
}

std::optional<ReduceOp> reduce_op_of(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ReduceOp::sum;
    case c10d::ReduceOp::AVG:
      return ReduceOp::avg;
    case c10d::ReduceOp::PRODUCT:
      return ReduceOp::prod;
    case c10d::ReduceOp::MIN:
      return ReduceOp::min;
    case c10d::ReduceOp::MAX:
      return ReduceOp::max;
    default:
      return std::nullopt;
  }
}

// Translates a braid::Error thrown while a call is checked or ordered into PyTorch's.
template <class F>
c10::intrusive_ptr<c10d::Work> translating(int rank, std::string_view op, F&& body) {
  try {
    return body();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, prefix(rank, op), e.what());
  }
}

}  // namespace

ProcessGroup::ProcessGroup(int rank, int size, std::shared_ptr<JoinedWorld> joined,
                           std::shared_ptr<collectives::Communicator> communicator)
    : c10d::Backend(rank, size),
      remains_(std::make_shared<Remains>()),
      completions_(std::make_shared<Completions>()),
      joined_(std::move(joined)),
      communicator_(std::move(communicator)) {
  init();
}

ProcessGroup::~ProcessGroup() {
  communicator_.reset();
  joined_.reset();  // the last group over its World leaves it and stops braid's thread
  // Operations still in flight (a group destroyed while another keeps braid's thread
  // running) complete on the completion threads, which hold what they need.
  remains_->release();
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::start(c10d::OpType type, std::string_view op,
                                                   asio::awaitable<void> operation,
                                                   std::vector<at::Tensor> outputs,
                                                   std::function<void()> finish) {
  remains_->release();  // the operations finished since the last call, let go here
  if (!outputs.empty() && outputs.front().is_cuda()) {
    // The copies out of a flat result run on the caller's stream (as the flat tensor was
    // made there), not on whatever stream braid's thread has current; the streams the
    // buffers name live until the operation ends.
    if (finish) finish = detail::on_current_stream(outputs.front().get_device(), std::move(finish));
    finish = [keep = cuda_streams_, work = std::move(finish)] {
      if (work) work();
    };
  }
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
  auto what = prefix(rank_, op);
  auto issued = completions_->issue();
  asio::co_spawn(joined_->runtime->executor(),
                 complete(std::move(operation), future, std::move(outputs), std::move(finish),
                          std::move(what), remains_, completions_, std::move(issued)),
                 asio::detached);
  return c10::make_intrusive<FutureWork>(rank_, type, std::move(future));
}

namespace {

// The one tensor of a single-device call, checked.
const at::Tensor& only(const std::vector<at::Tensor>& tensors, int rank, std::string_view op) {
  TORCH_CHECK(tensors.size() == 1, prefix(rank, op), "takes one tensor per call (one device), got ",
              tensors.size());
  return tensors[0];
}

ReduceOp checked_op(const c10d::ReduceOp& op, int rank, std::string_view name) {
  const std::optional<ReduceOp> braid_op = reduce_op_of(op);
  TORCH_CHECK(braid_op.has_value(), prefix(rank, name),
              "supports SUM, AVG, PRODUCT, MIN and MAX, not reduce op ", static_cast<int>(op.op_));
  return *braid_op;
}

// Every tensor of a list form: as many as ranks, each like `like`.
void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, int size, int rank,
                std::string_view op) {
  TORCH_CHECK(static_cast<int>(list.size()) == size, prefix(rank, op), "needs ", size,
              " tensors (one per rank), got ", list.size());
  for (const at::Tensor& t : list) {
    TORCH_CHECK(t.numel() == like.numel() && t.scalar_type() == like.scalar_type(),
                prefix(rank, op), "every tensor of the list must have ", like.numel(),
                " elements of ", like.scalar_type(), ", got ", t.numel(), " of ", t.scalar_type());
  }
}

// Copies block i of `flat` into list[i].
std::function<void()> copy_out(at::Tensor flat, std::vector<at::Tensor> list) {
  return [flat = std::move(flat), list = std::move(list)]() mutable {
    std::int64_t offset = 0;
    for (at::Tensor& t : list) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  };
}

at::Tensor flat_cat(const std::vector<at::Tensor>& list) {
  std::vector<at::Tensor> flat;
  flat.reserve(list.size());
  for (const at::Tensor& t : list) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

}  // namespace

Buffer ProcessGroup::buffer_of(const at::Tensor& tensor, std::string_view op) {
  TORCH_CHECK(tensor.device().is_cpu() || tensor.is_cuda(), prefix(rank_, op),
              "takes CPU or CUDA tensors, got one on ", tensor.device());
  Buffer buffer;
  try {
    buffer = as_buffer(tensor);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, prefix(rank_, op), e.what());
  }
  if (!tensor.is_cuda()) return buffer;
#if BRAID_WITH_TORCH_CUDA
  // Ordered on libtorch's current stream, as PyTorch's NCCL backend orders its calls: the
  // collective starts after the kernels enqueued there before the call.
  std::lock_guard lock(cuda_streams_->mutex);
  std::shared_ptr<dp::BucketDevice>& device = cuda_streams_->by_device[buffer.device()];
  if (!device) device = detail::libtorch_bucket_device(buffer.device());
  return buffer.on_stream(&device->producer());
#else
  TORCH_CHECK(false, prefix(rank_, op),
              "takes CUDA tensors where braid was built against a libtorch with CUDA; this "
              "one is CPU-only, got a tensor on ",
              tensor.device());
#endif
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  return translating(rank_, "allreduce", [&] {
    const at::Tensor& tensor = only(tensors, rank_, "allreduce");
    const ReduceOp op = checked_op(opts.reduceOp, rank_, "allreduce");
    return start(c10d::OpType::ALLREDUCE, "allreduce",
                 communicator_->all_reduce(buffer_of(tensor, "allreduce"), op), tensors);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return translating(rank_, "allreduce_coalesced", [&] {
    TORCH_CHECK(!tensors.empty(), prefix(rank_, "allreduce_coalesced"), "needs a tensor");
    for (const at::Tensor& t : tensors) {
      TORCH_CHECK(t.scalar_type() == tensors.front().scalar_type() &&
                      t.device() == tensors.front().device(),
                  prefix(rank_, "allreduce_coalesced"),
                  "takes tensors of one dtype on one device; got ", t.scalar_type(), " on ",
                  t.device(), " beside ", tensors.front().scalar_type(), " on ",
                  tensors.front().device());
      buffer_of(t, "allreduce_coalesced");  // contiguous, of a dtype braid moves
    }
    const ReduceOp op = checked_op(opts.reduceOp, rank_, "allreduce_coalesced");
    // One all-reduce of their concatenation, copied back into each.
    at::Tensor flat = flat_cat(tensors);
    auto operation = communicator_->all_reduce(buffer_of(flat, "allreduce_coalesced"), op);
    return start(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", std::move(operation),
                 tensors, copy_out(flat, tensors));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  return translating(rank_, "broadcast", [&] {
    const at::Tensor& tensor = only(tensors, rank_, "broadcast");
    return start(
        c10d::OpType::BROADCAST, "broadcast",
        communicator_->broadcast(buffer_of(tensor, "broadcast"), static_cast<int>(opts.rootRank)),
        tensors);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  return translating(rank_, "reduce", [&] {
    const at::Tensor& tensor = only(tensors, rank_, "reduce");
    const ReduceOp op = checked_op(opts.reduceOp, rank_, "reduce");
    return start(
        c10d::OpType::REDUCE, "reduce",
        communicator_->reduce(buffer_of(tensor, "reduce"), op, static_cast<int>(opts.rootRank)),
        tensors);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allgather(
    std::vector<std::vector<at::Tensor>>& output_tensors, std::vector<at::Tensor>& input_tensors,
    const c10d::AllgatherOptions& /*opts*/) {
  return translating(rank_, "allgather", [&] {
    const at::Tensor& input = only(input_tensors, rank_, "allgather");
    TORCH_CHECK(output_tensors.size() == 1, prefix(rank_, "allgather"),
                "takes one output list (one device), got ", output_tensors.size());
    check_list(output_tensors[0], input, size_, rank_, "allgather");
    at::Tensor flat = at::empty({input.numel() * size_}, input.options());
    auto operation =
        communicator_->all_gather(buffer_of(input, "allgather"), buffer_of(flat, "allgather"));
    return start(c10d::OpType::ALLGATHER, "allgather", std::move(operation), output_tensors[0],
                 copy_out(flat, output_tensors[0]));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& /*opts*/) {
  return translating(rank_, "_allgather_base", [&] {
    return start(c10d::OpType::_ALLGATHER_BASE, "_allgather_base",
                 communicator_->all_gather(buffer_of(input, "_allgather_base"),
                                           buffer_of(output, "_allgather_base")),
                 {output});
  });
}

std::vector<std::pair<Buffer, Buffer>> ProcessGroup::coalesced_buffers(
    const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
    std::string_view op) {
  TORCH_CHECK(outputs.size() == inputs.size(), prefix(rank_, op),
              "takes one output per input, got ", outputs.size(), " outputs for ", inputs.size(),
              " inputs");
  std::vector<std::pair<Buffer, Buffer>> buffers;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    buffers.emplace_back(buffer_of(inputs[i], op), buffer_of(outputs[i], op));
  }
  return buffers;
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  constexpr std::string_view op = "allgather_into_tensor_coalesced";
  return translating(rank_, op, [&] {
    std::vector<asio::awaitable<void>> operations;
    for (const auto& [in, out] : coalesced_buffers(outputs, inputs, op)) {
      operations.push_back(communicator_->all_gather(in, out));
    }
    return start(c10d::OpType::COALESCED, op, one_after_another(std::move(operations)), outputs);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::gather(
    std::vector<std::vector<at::Tensor>>& output_tensors, std::vector<at::Tensor>& input_tensors,
    const c10d::GatherOptions& opts) {
  return translating(rank_, "gather", [&] {
    const at::Tensor& input = only(input_tensors, rank_, "gather");
    const int root = static_cast<int>(opts.rootRank);
    if (rank_ != root) {
      TORCH_CHECK(output_tensors.empty(), prefix(rank_, "gather"),
                  "takes no output tensors on ranks other than the root");
      return start(c10d::OpType::GATHER, "gather",
                   communicator_->gather(buffer_of(input, "gather"), Buffer{}, root), {});
    }
    TORCH_CHECK(output_tensors.size() == 1, prefix(rank_, "gather"),
                "takes one output list on the root, got ", output_tensors.size());
    check_list(output_tensors[0], input, size_, rank_, "gather");
    at::Tensor flat = at::empty({input.numel() * size_}, input.options());
    auto operation =
        communicator_->gather(buffer_of(input, "gather"), buffer_of(flat, "gather"), root);
    return start(c10d::OpType::GATHER, "gather", std::move(operation), output_tensors[0],
                 copy_out(flat, output_tensors[0]));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::scatter(
    std::vector<at::Tensor>& output_tensors, std::vector<std::vector<at::Tensor>>& input_tensors,
    const c10d::ScatterOptions& opts) {
  return translating(rank_, "scatter", [&] {
    const at::Tensor& output = only(output_tensors, rank_, "scatter");
    const int root = static_cast<int>(opts.rootRank);
    if (rank_ != root) {
      TORCH_CHECK(input_tensors.empty(), prefix(rank_, "scatter"),
                  "takes no input tensors on ranks other than the root");
      return start(c10d::OpType::SCATTER, "scatter",
                   communicator_->scatter(Buffer{}, buffer_of(output, "scatter"), root),
                   output_tensors);
    }
    TORCH_CHECK(input_tensors.size() == 1, prefix(rank_, "scatter"),
                "takes one input list on the root, got ", input_tensors.size());
    check_list(input_tensors[0], output, size_, rank_, "scatter");
    at::Tensor flat = flat_cat(input_tensors[0]);
    auto operation =
        communicator_->scatter(buffer_of(flat, "scatter"), buffer_of(output, "scatter"), root);
    // The flat input lives until the scatter completes.
    return start(c10d::OpType::SCATTER, "scatter", std::move(operation), output_tensors, [flat] {});
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce_scatter(
    std::vector<at::Tensor>& output_tensors, std::vector<std::vector<at::Tensor>>& input_tensors,
    const c10d::ReduceScatterOptions& opts) {
  return translating(rank_, "reduce_scatter", [&] {
    const at::Tensor& output = only(output_tensors, rank_, "reduce_scatter");
    TORCH_CHECK(input_tensors.size() == 1, prefix(rank_, "reduce_scatter"),
                "takes one input list (one device), got ", input_tensors.size());
    check_list(input_tensors[0], output, size_, rank_, "reduce_scatter");
    const ReduceOp op = checked_op(opts.reduceOp, rank_, "reduce_scatter");
    at::Tensor flat = flat_cat(input_tensors[0]);
    auto operation = communicator_->reduce_scatter(buffer_of(flat, "reduce_scatter"),
                                                   buffer_of(output, "reduce_scatter"), op);
    return start(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", std::move(operation),
                 output_tensors, [flat] {});
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return translating(rank_, "_reduce_scatter_base", [&] {
    const ReduceOp op = checked_op(opts.reduceOp, rank_, "_reduce_scatter_base");
    return start(c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base",
                 communicator_->reduce_scatter(buffer_of(input, "_reduce_scatter_base"),
                                               buffer_of(output, "_reduce_scatter_base"), op),
                 {output});
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  constexpr std::string_view op = "reduce_scatter_tensor_coalesced";
  return translating(rank_, op, [&] {
    const ReduceOp reduce_op = checked_op(opts.reduceOp, rank_, op);
    std::vector<asio::awaitable<void>> operations;
    for (const auto& [in, out] : coalesced_buffers(outputs, inputs, op)) {
      operations.push_back(communicator_->reduce_scatter(in, out, reduce_op));
    }
    return start(c10d::OpType::COALESCED, op, one_after_another(std::move(operations)), outputs);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& output_split_sizes,
                                                           std::vector<int64_t>& input_split_sizes,
                                                           const c10d::AllToAllOptions& /*opts*/) {
  return translating(rank_, "alltoall_base", [&] {
    const Buffer in = buffer_of(input, "alltoall_base");
    const Buffer out = buffer_of(output, "alltoall_base");
    if (output_split_sizes.empty() && input_split_sizes.empty()) {
      return start(c10d::OpType::ALLTOALL_BASE, "alltoall_base", communicator_->all_to_all(in, out),
                   {output});
    }
    // Split sizes count rows of dimension 0; braid counts elements.
    auto counts_of = [&](const std::vector<int64_t>& splits, const at::Tensor& t) {
      const std::size_t size = static_cast<std::size_t>(size_);
      std::vector<std::size_t> counts(size, 0);
      const std::int64_t rows = t.dim() == 0 ? 1 : t.size(0);
      const std::int64_t row = rows == 0 ? 0 : t.numel() / rows;
      if (splits.empty()) {
        TORCH_CHECK(rows % size_ == 0, prefix(rank_, "alltoall_base"), "dimension 0 (", rows,
                    ") must divide by the group's size ", size_, " without split sizes");
        for (std::size_t r = 0; r < size; ++r)
          counts[r] = static_cast<std::size_t>(rows / size_ * row);
        return counts;
      }
      TORCH_CHECK(splits.size() == size, prefix(rank_, "alltoall_base"), "needs ", size_,
                  " split sizes, got ", splits.size());
      for (std::size_t r = 0; r < size; ++r) counts[r] = static_cast<std::size_t>(splits[r] * row);
      return counts;
    };
    // The counts live, as the communicator requires, until the operation completes.
    auto send_counts =
        std::make_shared<std::vector<std::size_t>>(counts_of(input_split_sizes, input));
    auto recv_counts =
        std::make_shared<std::vector<std::size_t>>(counts_of(output_split_sizes, output));
    auto operation = communicator_->all_to_all_v(in, *send_counts, out, *recv_counts);
    return start(c10d::OpType::ALLTOALL_BASE, "alltoall_base", std::move(operation), {output},
                 [send_counts, recv_counts] {});
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::alltoall(std::vector<at::Tensor>& output_tensors,
                                                      std::vector<at::Tensor>& input_tensors,
                                                      const c10d::AllToAllOptions& /*opts*/) {
  return translating(rank_, "alltoall", [&] {
    TORCH_CHECK(static_cast<int>(input_tensors.size()) == size_ &&
                    static_cast<int>(output_tensors.size()) == size_,
                prefix(rank_, "alltoall"), "needs ", size_, " input and output tensors, got ",
                input_tensors.size(), " and ", output_tensors.size());
    auto send_counts = std::make_shared<std::vector<std::size_t>>();
    auto recv_counts = std::make_shared<std::vector<std::size_t>>();
    std::int64_t received = 0;
    for (int r = 0; r < size_; ++r) {
      send_counts->push_back(static_cast<std::size_t>(input_tensors[r].numel()));
      recv_counts->push_back(static_cast<std::size_t>(output_tensors[r].numel()));
      received += output_tensors[r].numel();
    }
    at::Tensor in = flat_cat(input_tensors);
    at::Tensor out = at::empty({received}, output_tensors[0].options());
    auto operation = communicator_->all_to_all_v(buffer_of(in, "alltoall"), *send_counts,
                                                 buffer_of(out, "alltoall"), *recv_counts);
    auto copy = copy_out(out, output_tensors);
    return start(c10d::OpType::ALLTOALL, "alltoall", std::move(operation), output_tensors,
                 [copy, in, send_counts, recv_counts] { copy(); });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::send(std::vector<at::Tensor>& tensors, int dst_rank,
                                                  int /*tag*/) {
  return translating(rank_, "send", [&] {
    const at::Tensor& tensor = only(tensors, rank_, "send");
    return start(c10d::OpType::SEND, "send",
                 communicator_->send(buffer_of(tensor, "send"), dst_rank), tensors);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::recv(std::vector<at::Tensor>& tensors, int src_rank,
                                                  int /*tag*/) {
  return translating(rank_, "recv", [&] {
    const at::Tensor& tensor = only(tensors, rank_, "recv");
    auto receive = communicator_->recv(buffer_of(tensor, "recv"), src_rank);
    return start(c10d::OpType::RECV, "recv",
                 receive_exactly(std::move(receive), static_cast<std::size_t>(tensor.numel()),
                                 prefix(rank_, "recv")),
                 tensors);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::barrier(const c10d::BarrierOptions& /*opts*/) {
  return translating(rank_, "barrier", [&] {
    return start(c10d::OpType::BARRIER, "barrier", communicator_->barrier(), {});
  });
}

}  // namespace braid::torch
