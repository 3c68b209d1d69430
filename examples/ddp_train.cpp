// Data-parallel training with braid: a libtorch model wrapped in
// braid::torch::DistributedDataParallel, trained on a synthetic task (a student network
// learning a fixed random teacher), each rank on its own shard of the data. Gradients are
// all-reduced in buckets while backward is still running; the run ends with the overlap
// summary (how much of that communication backward hid).
//
//   braid-run -n 2 build/examples/ddp_train                     # MLP, 60 steps
//   braid-run -n 2 build/examples/ddp_train --model transformer
//   BRAID_TRACE=traces braid-run -n 2 build/examples/ddp_train  # plus a trace per rank
//
// Options: --model mlp|transformer  --steps N  --batch B (per rank)  --hidden H
//          --layers L  --lr X  --sync ddp|none (none: no gradient sync, for comparison)
//          --bench (time steps after a warm-up and print one JSON line on rank 0)
//          --threads T (libtorch intra-op threads per rank, default 1)
//          --optimizer adam|sgd (default adam, lr --lr; sgd: lr 0.01, momentum 0.9)
//          --bucket-cap-mib M (DDP bucket cap, default 25)
//          --bucket-view (gradients as views into the buckets: no copies)
#include <chrono>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <numeric>
#include <string>

#include <fmt/format.h>
#include <torch/torch.h>

#include <braid/braid.hpp>
#include <braid/torch/distributed_data_parallel.hpp>
#include <braid/torch/tensor_buffer.hpp>

namespace {

struct Settings {
  std::string model = "mlp";
  int steps = 60;
  int batch = 32;
  int hidden = 256;
  int layers = 4;
  double lr = 1e-3;
  std::string sync = "ddp";
  bool bench = false;
  int threads = 1;
  std::string optimizer = "adam";
  double bucket_cap_mib = 25;
  bool bucket_view = false;
};

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--model")
      s.model = value();
    else if (arg == "--steps")
      s.steps = std::stoi(value());
    else if (arg == "--batch")
      s.batch = std::stoi(value());
    else if (arg == "--hidden")
      s.hidden = std::stoi(value());
    else if (arg == "--layers")
      s.layers = std::stoi(value());
    else if (arg == "--lr")
      s.lr = std::stod(value());
    else if (arg == "--sync")
      s.sync = value();
    else if (arg == "--threads")
      s.threads = std::stoi(value());
    else if (arg == "--optimizer")
      s.optimizer = value();
    else if (arg == "--bucket-cap-mib")
      s.bucket_cap_mib = std::stod(value());
    else if (arg == "--bench")
      s.bench = true;
    else if (arg == "--bucket-view")
      s.bucket_view = true;
    else
      throw std::invalid_argument("unknown option " + arg);
  }
  if (s.model != "mlp" && s.model != "transformer")
    throw std::invalid_argument("--model mlp|transformer");
  if (s.sync != "ddp" && s.sync != "none") throw std::invalid_argument("--sync ddp|none");
  if (s.optimizer != "adam" && s.optimizer != "sgd")
    throw std::invalid_argument("--optimizer adam|sgd");
  if (s.steps < 2 || s.batch < 1 || s.hidden < 8 || s.layers < 1 || s.threads < 1) {
    throw std::invalid_argument("--steps >= 2, --batch >= 1, --hidden >= 8, --layers >= 1");
  }
  return s;
}

// hidden -> hidden x layers -> hidden/2 -> 1, ReLU between.
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int hidden, int layers) {
    for (int i = 0; i < layers; ++i) {
      body->push_back(torch::nn::Linear(hidden, hidden));
      body->push_back(torch::nn::ReLU());
    }
    body->push_back(torch::nn::Linear(hidden, hidden / 2));
    body->push_back(torch::nn::ReLU());
    body->push_back(torch::nn::Linear(hidden / 2, 1));
    register_module("body", body);
  }
  torch::Tensor forward(const torch::Tensor& x) { return body->forward(x); }
  torch::nn::Sequential body;
};
TORCH_MODULE(Mlp);

// An encoder block (self-attention + feed-forward) on sequences of 16 tokens, then a
// linear head on the mean token.
struct TransformerImpl : torch::nn::Module {
  explicit TransformerImpl(int hidden, int layers) {
    for (int i = 0; i < layers; ++i) {
      blocks.push_back(register_module(
          "block" + std::to_string(i),
          torch::nn::TransformerEncoderLayer(torch::nn::TransformerEncoderLayerOptions(hidden, 4)
                                                 .dim_feedforward(2 * hidden)
                                                 .dropout(0.0))));
    }
    head = register_module("head", torch::nn::Linear(hidden, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {  // x: [seq, batch, hidden]
    torch::Tensor h = x;
    for (auto& block : blocks) h = block->forward(h);
    return head->forward(h.mean(0));
  }
  std::vector<torch::nn::TransformerEncoderLayer> blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Transformer);

constexpr int kSequence = 16;

// The synthetic task: inputs from a per-rank, per-step seed; targets from a fixed teacher
// (the same on every rank): a smooth function of a random projection of the first 16
// features.
struct Task {
  static constexpr int kFeatures = 16;
  torch::Tensor teacher;
  bool transformer;
  int hidden;
  Task(int hidden_, bool transformer_) : transformer(transformer_), hidden(hidden_) {
    torch::manual_seed(4242);
    teacher = torch::randn({kFeatures, 1}) / 4;
  }
  std::pair<torch::Tensor, torch::Tensor> batch(int rank, int step, int size) const {
    torch::manual_seed(1000003 * (step + 1) + rank);
    if (!transformer) {
      torch::Tensor x = torch::randn({size, hidden});
      return {x, torch::tanh(x.narrow(1, 0, kFeatures).matmul(teacher) * 2)};
    }
    torch::Tensor x = torch::randn({kSequence, size, hidden});
    return {x, torch::tanh(x.mean(0).narrow(1, 0, kFeatures).matmul(teacher) * 8)};
  }
};

template <class Model>
int train(braid::transport::World& world, const Settings& s, Model model) {
  auto comm = braid::collectives::Communicator::world(world);
  const Task task(s.hidden, s.model == "transformer");
  std::int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  const bool sync = s.sync == "ddp";
  std::optional<braid::torch::DistributedDataParallel<Model>> ddp;
  braid::torch::DistributedDataParallelOptions options;
  options.limits.bucket_cap_bytes = static_cast<std::size_t>(s.bucket_cap_mib * (1 << 20));
  options.gradient_as_bucket_view = s.bucket_view;
  if (sync) ddp.emplace(model, comm, options);  // broadcasts rank 0's initial weights
  // Adam converges on the task in a few dozen steps; SGD (lr 0.01, momentum 0.9) is the
  // cheaper step the benchmark uses, so communication is a larger share of it.
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (s.optimizer == "adam") {
    optimizer =
        std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(s.lr));
  } else {
    optimizer = std::make_unique<torch::optim::SGD>(model->parameters(),
                                                    torch::optim::SGDOptions(0.01).momentum(0.9));
  }
  if (comm->rank() == 0 && !s.bench) {
    std::cout << fmt::format(
        "ddp_train: {} with {:.2f}M parameters on {} rank(s), batch {} per "
        "rank, {} steps, gradient sync: {}\n",
        s.model, static_cast<double>(parameters) / 1e6, comm->size(), s.batch, s.steps,
        sync ? "braid DDP" : "none");
  }
  const int warmup = s.bench ? std::min(5, s.steps / 4) : 0;
  double first_loss = 0;
  double last_loss = 0;
  std::deque<double> recent;  // the last 5 losses: one batch's loss is noisy
  auto timed_from = std::chrono::steady_clock::now();
  // The summary covers the training steps from the second on (the first builds buckets).
  std::int64_t summary_from_ns = 0;
  for (int step = 0; step < s.steps; ++step) {
    if (step == warmup) {
      comm->launch(comm->barrier()).get();
      timed_from = std::chrono::steady_clock::now();
    }
    if (step == 1) summary_from_ns = braid::trace::now_ns();
    const auto started = std::chrono::steady_clock::now();
    auto [x, y] = task.batch(comm->rank(), step, s.batch);
    optimizer->zero_grad();
    torch::Tensor prediction = sync ? ddp->forward(x) : model->forward(x);
    torch::Tensor loss = torch::mse_loss(prediction, y);
    loss.backward();
    {
      braid::trace::ComputeRegion region("optimizer");
      optimizer->step();
    }
    const double value = loss.item<double>();
    recent.push_back(value);
    if (recent.size() > 5) recent.pop_front();
    if (step == 4) first_loss = std::accumulate(recent.begin(), recent.end(), 0.0) / 5;
    last_loss =
        std::accumulate(recent.begin(), recent.end(), 0.0) / static_cast<double>(recent.size());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    if (comm->rank() == 0 && !s.bench && (step % 5 == 0 || step == s.steps - 1)) {
      const int done = (step + 1) * 30 / s.steps;
      std::cout << fmt::format("step {:>4}/{} [{:<30}] loss {:.5f}  {:.1f} ms/step\n", step + 1,
                               s.steps, std::string(static_cast<std::size_t>(done), '#'), value, ms)
                << std::flush;
    }
  }
  const std::int64_t summary_to_ns = braid::trace::now_ns();
  const double step_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - timed_from)
          .count() /
      (s.steps - warmup);
  // Every rank holds the same weights after DDP: check one checksum across ranks.
  std::vector<double> checksum{0.0};
  for (const auto& p : model->parameters()) checksum[0] += p.sum().template item<double>();
  std::vector<double> low = checksum;
  std::vector<double> high = checksum;
  comm->launch(comm->all_reduce(braid::Buffer(low), braid::ReduceOp::min)).get();
  comm->launch(comm->all_reduce(braid::Buffer(high), braid::ReduceOp::max)).get();
  if (sync && low[0] != high[0]) {
    std::cerr << fmt::format("ddp_train: ranks disagree on the weights ({} vs {})\n", low[0],
                             high[0]);
    return 1;
  }

  // The overlap summary from this process's own trace, gathered to rank 0.
  braid::trace::Snapshot snapshot = braid::trace::snapshot();
  std::erase_if(snapshot.records, [&](const braid::trace::Record& r) {
    return r.begin_ns < summary_from_ns || r.end_ns > summary_to_ns;
  });
  braid::trace::Timeline mine;
  mine.world_size = 1;
  mine.ranks.push_back(braid::trace::rank_timeline(snapshot, {.rank = comm->rank()}));
  const braid::trace::OverlapFigures f = braid::trace::summarize(mine).ranks.at(0).figures;
  std::vector<std::int64_t> figures{f.wall_ns, f.compute_ns, f.communication_ns, f.overlap_ns,
                                    f.exposed_ns};
  std::vector<std::int64_t> all(figures.size() * static_cast<std::size_t>(comm->size()));
  comm->launch(comm->all_gather(braid::Buffer(figures), braid::Buffer(all))).get();

  // The bare all-reduce of every gradient at once, for comparison with what DDP exposed.
  double bare_ms = 0;
  if (s.bench) {
    std::vector<float> gradients(static_cast<std::size_t>(parameters), 1.0f);
    comm->launch(comm->all_reduce(braid::Buffer(gradients), braid::ReduceOp::sum)).get();
    constexpr int kRounds = 5;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kRounds; ++i) {
      comm->launch(comm->all_reduce(braid::Buffer(gradients), braid::ReduceOp::sum)).get();
    }
    bare_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count() /
              kRounds;
  }
  if (comm->rank() != 0) return 0;
  braid::trace::Summary summary;
  summary.world_size = comm->size();
  for (int r = 0; r < comm->size(); ++r) {
    braid::trace::RankSummary rank;
    rank.rank = r;
    const std::int64_t* v = all.data() + 5 * r;
    rank.figures = {.wall_ns = v[0],
                    .compute_ns = v[1],
                    .communication_ns = v[2],
                    .overlap_ns = v[3],
                    .exposed_ns = v[4]};
    summary.job.figures.wall_ns = std::max(summary.job.figures.wall_ns, v[0]);
    summary.job.figures.compute_ns += v[1];
    summary.job.figures.communication_ns += v[2];
    summary.job.figures.overlap_ns += v[3];
    summary.job.figures.exposed_ns += v[4];
    summary.ranks.push_back(rank);
  }
  if (s.bench) {
    const double exposed_ms =
        static_cast<double>(summary.job.figures.exposed_ns) / 1e6 / comm->size() / (s.steps - 1);
    std::cout << fmt::format(
        "{{\"sync\":\"{}\",\"model\":\"{}\",\"parameters\":{},\"ranks\":{},"
        "\"step_ms\":{:.3f},\"exposed_ms_per_step\":{:.3f},"
        "\"bare_all_reduce_ms\":{:.3f},\"loss\":{:.6f}}}\n",
        s.sync, s.model, parameters, comm->size(), step_ms, exposed_ms, bare_ms, last_loss);
    return 0;
  }
  // Losses are means of 5 steps: steps 1-5 against the last 5.
  std::cout << fmt::format("\nloss {:.5f} -> {:.5f} ({}), {:.1f} ms/step\n", first_loss, last_loss,
                           last_loss < first_loss / 3 ? "converged" : "not converged", step_ms);
  std::cout << "\noverlap of gradient all-reduces with compute (forward, backward, optimizer):\n"
            << braid::trace::format_text(summary);
  if (auto file = braid::trace::output_file()) {
    std::cout << "trace: " << file->parent_path().string() << " (braid-trace summary / html)\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Settings settings = parse(argc, argv);
    torch::set_num_threads(settings.threads);
    braid::trace::set_enabled(true);  // for the closing summary; BRAID_TRACE also writes files
    braid::Runtime runtime;
    auto world = braid::transport::World::join(runtime);
    if (settings.model == "mlp")
      return train(*world, settings, Mlp(settings.hidden, settings.layers));
    return train(*world, settings, Transformer(settings.hidden, settings.layers));
  } catch (const std::invalid_argument& e) {
    std::cerr << "ddp_train: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ddp_train: " << e.what() << "\n";
    return 1;
  }
}
