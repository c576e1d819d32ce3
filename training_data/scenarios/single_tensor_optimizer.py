"""single_tensor_optimizer: Adam updating parameters one tensor at a time (`foreach=False`).

With `foreach=False` Adam runs `_single_tensor_adam`: a Python loop issuing ~10 small ops per
parameter tensor (on a GPU, ~10 kernel launches each). The model is a deep stack of small Linear
layers, so there are many parameter tensors and the per-parameter loop dominates the step.
On CPU, torch's default (`foreach=None`) is also the single-tensor path; here it is spelled out.
--severity sets the number of Linear layers (2 parameter tensors each): low 8, mid 16, high 32.
Clean twin: single_tensor_optimizer_clean.py (`foreach=True`: `_multi_tensor_adam`, `aten::_foreach_*`).
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
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    data = [(torch.randn(BATCH, WIDTH, device=device), torch.randint(0, WIDTH, (BATCH,), device=device))
            for _ in range(4)]
    with profiler(args, "single_tensor_optimizer", layers=LAYERS[args.severity]) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y)
            prof.step()
    print(f"single_tensor_optimizer: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
