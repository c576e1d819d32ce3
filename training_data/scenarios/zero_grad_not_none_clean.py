"""zero_grad_not_none_clean: twin of zero_grad_not_none.py with `opt.zero_grad(set_to_none=True)`.

Gradients are dropped instead of zero-filled: no `aten::zero_` inside `Optimizer.zero_grad#...`,
and backward writes fresh gradient tensors instead of accumulating into zeroed ones.
--severity sets the number of Linear layers as in zero_grad_not_none.py (low 8, mid 16, high 32).
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
    opt.zero_grad(set_to_none=True)
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
    with profiler(args, "zero_grad_not_none_clean", layers=LAYERS[args.severity]) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y)
            prof.step()
    print(f"zero_grad_not_none_clean: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
