"""allocator_churn_clean: twin of allocator_churn.py that keeps the CUDA cache warm.

The same micro-batches without `torch.cuda.empty_cache()`: after the first step every activation and
gradient reuses a cached block, so the steady-state ProfilerSteps hold no `cudaMalloc`/`cudaFree`.
--severity sets the micro-batches per step as in allocator_churn.py (low 1, mid 2, high 4).
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
    with profiler(args, "allocator_churn_clean", micro_batches=n_micro) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y, n_micro)
            prof.step()
    print(f"allocator_churn_clean: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
