"""fleet's nightly reference workload: a small transformer-style MLP block, trained for a fixed
number of steps on random data, each step in NVTX ranges (train_step, forward, backward,
optimizer) so that nsys's nvtx_sum has something to trend.

    python3 reference.py [--steps N] [--width W] [--slowdown]

Deterministic work: the same kernels, the same number of times, every run, so that a change in
GPU time means the GPU, the driver or the software got slower, not the workload. `--slowdown`
recomputes the LayerNorm and the up-projection once more every step (one extra GEMM forward
and its gradients backward): a deliberate regression of the GEMM kernels, about half again as
much GEMM time on an H200, for checking that the nightly report catches one.
"""
import argparse
import time

import torch

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--width", type=int, default=2048)
parser.add_argument("--batch", type=int, default=4096)
parser.add_argument("--slowdown", action="store_true", help="one redundant GEMM per step (a planted regression)")
args = parser.parse_args()

torch.manual_seed(0)
dev = torch.device("cuda")
up = torch.nn.Linear(args.width, 4 * args.width, device=dev)
down = torch.nn.Linear(4 * args.width, args.width, device=dev)
norm = torch.nn.LayerNorm(args.width, device=dev)
params = [*up.parameters(), *down.parameters(), *norm.parameters()]
opt = torch.optim.SGD(params, lr=1e-3)
x = torch.randn(args.batch, args.width, device=dev)
target = torch.randn(args.batch, args.width, device=dev)

start = time.time()
for _ in range(args.steps):
    with torch.cuda.nvtx.range("train_step"):
        with torch.cuda.nvtx.range("forward"):
            h = up(norm(x))
            if args.slowdown:  # the planted regression: the same projection computed twice
                h = (h + up(norm(x))) * 0.5
            loss = torch.nn.functional.mse_loss(down(torch.nn.functional.gelu(h)) + x, target)
        with torch.cuda.nvtx.range("backward"):
            opt.zero_grad(set_to_none=True)
            loss.backward()
        with torch.cuda.nvtx.range("optimizer"):
            opt.step()
torch.cuda.synchronize()
print(f"reference: {args.steps} steps, width {args.width}, batch {args.batch}"
      f"{', slowed down' if args.slowdown else ''}: {time.time() - start:.2f} s, loss {loss.item():.4f}", flush=True)
