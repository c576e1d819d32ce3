"""allocator_churn: empties PyTorch's CUDA cache after every micro-batch.

`torch.cuda.empty_cache()` hands the caching allocator's free blocks back to the driver, so the
next micro-batch allocates its activations and gradients again with `cudaMalloc`, and the cache
release itself calls `cudaFree`, which waits for the device. The trace shows `cudaMalloc` /
`cudaFree` runtime calls inside every steady-state ProfilerStep (a warm cache shows none).
--severity sets the micro-batches per step, one `empty_cache()` after each: low 1, mid 2, high 4.
Clean twin: allocator_churn_clean.py (no `empty_cache()` in the loop).
GPU only: without CUDA `empty_cache()` does nothing and the trace shows no allocator call.
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

MICRO_BATCHES = {"low": 1, "mid": 2, "high": 4}
BATCH, WIDTH, CLASSES = 2048, 2048, 64


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.ReLU(),
        nn.Linear(WIDTH, WIDTH), nn.ReLU(),
        nn.Linear(WIDTH, CLASSES),
    )


def train_step(model, opt, x, y, n_micro):
    opt.zero_grad(set_to_none=True)
    for xb, yb in zip(x.chunk(n_micro), y.chunk(n_micro)):
        loss = F.cross_entropy(model(xb), yb) / n_micro
        loss.backward()
        torch.cuda.empty_cache()
    opt.step()
    return loss.detach()


def main():
    args = parse_args(__doc__)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    data = [(torch.randn(BATCH, WIDTH, device=device), torch.randint(0, CLASSES, (BATCH,), device=device))
            for _ in range(2)]
    n_micro = MICRO_BATCHES[args.severity]
    with profiler(args, "allocator_churn", micro_batches=n_micro) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y, n_micro)
            prof.step()
    print(f"allocator_churn: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
