"""misaligned_gemm: Linear layers whose sizes are not multiples of 8 (1001 -> 999, batch 63).

GEMM kernels (tensor cores on a GPU, AVX-512/AMX blocking on a CPU) work on tiles of 8/16/64
elements; odd M/N/K leave partial tiles, fall back to slower kernels or need padding. In the trace
the `aten::addmm`/`aten::mm` `Input Dims` show the odd sizes ([63, 1001] x [1001, 999], ...).
The sizes are set on one line (IN_FEATURES, HIDDEN, BATCH); the fix rounds them to multiples of
8 (better 64).
--severity sets the number of hidden 999-wide layers: low 1, mid 2, high 4.
Clean twin: misaligned_gemm_clean.py (1024 -> 1024, batch 64).
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

HIDDEN_LAYERS = {"low": 1, "mid": 2, "high": 4}
IN_FEATURES, HIDDEN, BATCH = 1001, 999, 63
CLASSES = 64


def build_model(n_hidden: int) -> nn.Module:
    layers = [nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU()]
    for _ in range(n_hidden - 1):
        layers += [nn.Linear(HIDDEN, HIDDEN), nn.ReLU()]
    layers.append(nn.Linear(HIDDEN, CLASSES))
    return nn.Sequential(*layers)


def train_step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


def main():
    args = parse_args(__doc__)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    model = build_model(HIDDEN_LAYERS[args.severity]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    data = [(torch.randn(BATCH, IN_FEATURES, device=device), torch.randint(0, CLASSES, (BATCH,), device=device))
            for _ in range(4)]
    with profiler(args, "misaligned_gemm", hidden_layers=HIDDEN_LAYERS[args.severity]) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y)
            prof.step()
    print(f"misaligned_gemm: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
