"""sync_point: reads the loss back to Python with `loss.item()` on every micro-batch of every step.

On a GPU each `.item()` is a device-to-host copy plus a stream synchronisation that stalls the
host until all queued kernels finish; in the trace it shows as `aten::item` ->
`aten::_local_scalar_dense` (and `cudaStreamSynchronize`/`Memcpy DtoH` on a GPU).
--severity sets the number of micro-batches per step, i.e. syncs per step: low 1, mid 4, high 8.
Clean twin: sync_point_clean.py (accumulates on device, reads every LOG_EVERY steps).
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

MICRO_BATCHES = {"low": 1, "mid": 4, "high": 8}
BATCH, FEATURES, HIDDEN, CLASSES = 256, 256, 256, 64


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def train_step(model, opt, x, y, n_micro, stats):
    opt.zero_grad()
    for xb, yb in zip(x.chunk(n_micro), y.chunk(n_micro)):
        loss = F.cross_entropy(model(xb), yb) / n_micro
        loss.backward()
        stats["loss"] += loss.item()
    opt.step()


def main():
    args = parse_args(__doc__)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    model = build_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    data = [(torch.randn(BATCH, FEATURES, device=device), torch.randint(0, CLASSES, (BATCH,), device=device))
            for _ in range(4)]
    stats = {"loss": 0.0}
    with profiler(args, "sync_point", micro_batches=MICRO_BATCHES[args.severity]) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            train_step(model, opt, x, y, MICRO_BATCHES[args.severity], stats)
            prof.step()
    print(f"sync_point: mean loss {stats['loss'] / prof.total_steps:.4f}")


if __name__ == "__main__":
    main()
