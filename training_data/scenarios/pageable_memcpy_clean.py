"""pageable_memcpy_clean: twin of pageable_memcpy.py with pinned batches and asynchronous copies.

The batches are page-locked once (`.pin_memory()`, on a GPU run) and copied with
`x.to(device, non_blocking=True)`: the copy engine reads them straight from host memory at full bus
speed and the host goes on queueing kernels. The trace shows `Memcpy HtoD (Pinned -> Device)`.
--severity sets the rows per batch as in pageable_memcpy.py (low 512, mid 2048, high 8192).
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

ROWS = {"low": 512, "mid": 2048, "high": 8192}
FEATURES, HIDDEN, CLASSES = 2048, 256, 64


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def train_step(model, opt, x, y, device):
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


def main():
    args = parse_args(__doc__)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    rows = ROWS[args.severity]
    data = [(torch.randn(rows, FEATURES), torch.randint(0, CLASSES, (rows,))) for _ in range(4)]
    if device.type == "cuda":
        data = [(x.pin_memory(), y.pin_memory()) for x, y in data]
    with profiler(args, "pageable_memcpy_clean", rows=rows) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y, device)
            prof.step()
    print(f"pageable_memcpy_clean: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
