"""sync_point_clean: twin of sync_point.py without per-step host syncs.

The loss is accumulated on the device (`running += loss.detach()`) and read back with one
`.item()` every LOG_EVERY steps, which never falls inside the few recorded steps here.
--severity sets the number of micro-batches per step as in sync_point.py (low 1, mid 4, high 8).
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

MICRO_BATCHES = {"low": 1, "mid": 4, "high": 8}
BATCH, FEATURES, HIDDEN, CLASSES = 256, 256, 256, 64
LOG_EVERY = 100


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def train_step(model, opt, x, y, n_micro, running):
    opt.zero_grad()
    for xb, yb in zip(x.chunk(n_micro), y.chunk(n_micro)):
        loss = F.cross_entropy(model(xb), yb) / n_micro
        loss.backward()
        running += loss.detach()
    opt.step()


def main():
    args = parse_args(__doc__)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    model = build_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    data = [(torch.randn(BATCH, FEATURES, device=device), torch.randint(0, CLASSES, (BATCH,), device=device))
            for _ in range(4)]
    running = torch.zeros((), device=device)
    with profiler(args, "sync_point_clean", micro_batches=MICRO_BATCHES[args.severity]) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            train_step(model, opt, x, y, MICRO_BATCHES[args.severity], running)
            if (step + 1) % LOG_EVERY == 0:
                print(f"step {step + 1}: mean loss {running.item() / LOG_EVERY:.4f}")
                running.zero_()
            prof.step()
    print(f"sync_point_clean: loss since last log {running.item():.4f}")


if __name__ == "__main__":
    main()
