"""fp32_matmul_clean: twin of fp32_matmul.py running forward under bf16 autocast.

`torch.autocast("cpu", dtype=torch.bfloat16)` runs the Linear GEMMs with bfloat16 inputs (the
backward GEMMs follow); parameters and the optimizer stay float32. On a GPU the equivalent fix is
TF32 (`torch.set_float32_matmul_precision("high")`) or `torch.autocast("cuda", dtype=torch.bfloat16)`.
Autocast's weight casts show as `aten::_to_copy` under `aten::linear`: they are the price of
autocast, not redundant copies.
--severity sets the MLP width as in fp32_matmul.py (low 256, mid 512, high 1024).
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

WIDTH = {"low": 256, "mid": 512, "high": 1024}
BATCH, CLASSES = 128, 64


def build_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, CLASSES),
    )


def train_step(model, opt, x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
        loss = F.cross_entropy(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


def main():
    args = parse_args(__doc__)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    width = WIDTH[args.severity]
    model = build_model(width).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    data = [(torch.randn(BATCH, width, device=device), torch.randint(0, CLASSES, (BATCH,), device=device))
            for _ in range(4)]
    with profiler(args, "fp32_matmul_clean", width=width) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y)
            prof.step()
    print(f"fp32_matmul_clean: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
