"""single_tensor_optimizer_clean: twin of single_tensor_optimizer.py with `foreach=True`.

Adam runs `_multi_tensor_adam`: one `aten::_foreach_*` op per update stage for all parameters
at once (on a GPU, a handful of multi-tensor kernels instead of ~10 launches per parameter).
`fused=True` is the other fix (torch >= 2.4 has a fused CPU Adam as well).
--severity sets the number of Linear layers as in single_tensor_optimizer.py (low 8, mid 16, high 32).
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

LAYERS = {"low": 8, "mid": 16, "high": 32}
BATCH, WIDTH = 64, 64


def build_model(n_layers: int) -> nn.Module:
    layers = []
    for _ in range(n_layers):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
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
    model = build_model(LAYERS[args.severity]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    data = [(torch.randn(BATCH, WIDTH, device=device), torch.randint(0, WIDTH, (BATCH,), device=device))
            for _ in range(4)]
    with profiler(args, "single_tensor_optimizer_clean", layers=LAYERS[args.severity]) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y)
            prof.step()
    print(f"single_tensor_optimizer_clean: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
