"""pageable_memcpy: copies every step's input batch to the GPU from pageable host memory.

The batches live in ordinary (pageable) host memory and reach the GPU through a plain
`x.to(device)`: the driver stages each copy through its own pinned bounce buffer, the copy runs at
a fraction of the bus speed and blocks the host until it is done, so the GPU idles meanwhile. The
trace shows `Memcpy HtoD (Pageable -> Device)` GPU events under `aten::copy_` / `cudaMemcpyAsync`.
--severity sets the rows per batch (2048 float32 features a row): low 512 (4 MiB), mid 2048
(16 MiB), high 8192 (64 MiB).
Clean twin: pageable_memcpy_clean.py (batches pinned once with `.pin_memory()`, copied with
`non_blocking=True`).
GPU only: on a CPU `.to(device)` is a no-op and the trace shows no copy at all.
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
    x, y = x.to(device), y.to(device)
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
    with profiler(args, "pageable_memcpy", rows=rows) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y, device)
            prof.step()
    print(f"pageable_memcpy: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
