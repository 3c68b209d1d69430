#!/usr/bin/python3
"""One training step of the main job's models in Python PyTorch, for `braid-bench compute-tax`
to print beside the same step in a plain libtorch C++ program and in a braid process
(tools/braid_bench/workers/compute_step.cpp).

    /usr/bin/python3 tools/braid_bench/peers/compute_torch.py --model mlp --optimizer adam

The models mirror models/braid_models/models.hpp: the MLP is hidden -> hidden x layers -> hidden/2 -> 1
with ReLU (512 x 5 by default); the transformer is `layers` encoder layers (4 heads,
feed-forward 2 x hidden, no dropout) on sequences of 16 tokens and a linear head on the mean
token (256 x 4). One fixed batch, MSE loss, Adam (lr 1e-3) or SGD (lr 0.01, momentum 0.9),
one intra-op thread. A step is zero_grad, forward, loss, backward and the optimizer's step.

Output: one JSON line with the fields the C++ workers print; times are medians over the
timed steps, faults_per_step the process's minor page faults per timed step.
"""
import argparse
import json
import resource
import time

import torch


def mlp(hidden, layers):
    body = []
    for _ in range(layers):
        body += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    body += [torch.nn.Linear(hidden, hidden // 2), torch.nn.ReLU(), torch.nn.Linear(hidden // 2, 1)]
    return torch.nn.Sequential(*body)


class Transformer(torch.nn.Module):
    def __init__(self, hidden, layers):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(hidden, 4, dim_feedforward=2 * hidden, dropout=0.0)
            for _ in range(layers))
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, x):  # x: [seq, batch, hidden]
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(0))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["mlp", "transformer"], default="mlp")
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    parser.add_argument("--hidden", type=int, default=0)
    parser.add_argument("--layers", type=int, default=0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    transformer = args.model == "transformer"
    hidden = args.hidden or (256 if transformer else 512)
    layers = args.layers or (4 if transformer else 5)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)  # as braid's runners (example_models::set_compute_threads)
    torch.manual_seed(4242)
    teacher = torch.randn(16, 1) / 4
    model = Transformer(hidden, layers) if transformer else mlp(hidden, layers)
    if args.optimizer == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(1000003)
    if transformer:
        x = torch.randn(16, args.batch, hidden)
        y = torch.tanh(x.mean(0)[:, :16].matmul(teacher) * 8)
    else:
        x = torch.randn(args.batch, hidden)
        y = torch.tanh(x[:, :16].matmul(teacher) * 2)

    steps, forward_backward, optimizer_times = [], [], []
    faults_before = 0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)  # as the C++ workers zero
        torch.nn.functional.mse_loss(model(x), y).backward()
        backward_done = time.perf_counter()
        optimizer.step()
        done = time.perf_counter()
        if step >= args.warmup:
            steps.append((done - started) * 1e3)
            forward_backward.append((backward_done - started) * 1e3)
            optimizer_times.append((done - backward_done) * 1e3)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before

    def median(values):
        return sorted(values)[len(values) // 2]

    print(json.dumps({
        "compute_step": "python",
        "model": args.model,
        "optimizer": args.optimizer,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": args.batch,
        "steps": args.steps,
        "step_ms": round(median(steps), 3),
        "forward_backward_ms": round(median(forward_backward), 3),
        "optimizer_ms": round(median(optimizer_times), 3),
        "faults_per_step": round(faults / args.steps, 1),
    }, separators=(",", ":")))


if __name__ == "__main__":
    main()
