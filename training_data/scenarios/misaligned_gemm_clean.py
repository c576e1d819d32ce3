"""misaligned_gemm_clean: twin of misaligned_gemm.py with aligned sizes (1024 -> 1024, batch 64).

Every GEMM dimension is a multiple of 64, so no partial tiles.
--severity sets the number of hidden layers as in misaligned_gemm.py (low 1, mid 2, high 4).
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

HIDDEN_LAYERS = {"low": 1, "mid": 2, "high": 4}
IN_FEATURES, HIDDEN, BATCH = 1024, 1024, 64
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
    with profiler(args, "misaligned_gemm_clean", hidden_layers=HIDDEN_LAYERS[args.severity]) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y)
            prof.step()
    print(f"misaligned_gemm_clean: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
