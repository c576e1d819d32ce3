"""zero_grad_not_none: clears gradients by writing zeros (`opt.zero_grad(set_to_none=False)`).

Every step this runs an `aten::zero_` (a memset kernel on a GPU) per parameter tensor inside
`Optimizer.zero_grad#...`, and the next backward then accumulates into the zeroed buffers
(`aten::add_` under AccumulateGrad) instead of just taking the new gradient.
`zero_grad()` (set_to_none=True, the default since torch 2.0) does neither.
--severity sets the number of Linear layers (2 parameter tensors each): low 8, mid 16, high 32.
Clean twin: zero_grad_not_none_clean.py.
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

LAYERS = {"low": 8, "mid": 16, "high": 32}
BATCH, WIDTH = 64, 128


def build_model(n_layers: int) -> nn.Module:
    layers = []
    for _ in range(n_layers):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers)


def train_step(model, opt, x, y):
    opt.zero_grad(set_to_none=False)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def main():
    args = parse_args(__doc__)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    model = build_model(LAYERS[args.severity]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    data = [(torch.randn(BATCH, WIDTH, device=device), torch.randint(0, WIDTH, (BATCH,), device=device))
            for _ in range(4)]
    with profiler(args, "zero_grad_not_none", layers=LAYERS[args.severity]) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y)
            prof.step()
    print(f"zero_grad_not_none: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
