"""memory_growth_clean: twin of memory_growth.py that keeps the confidence metric `.detach()`ed.

The history holds 0-d tensors with no graph, so memory stays flat from step to step (recorded
with `profile_memory=True` as well, for comparison).
--severity sets the number of classes as in memory_growth.py (low 256, mid 1024, high 4096).
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

CLASSES = {"low": 256, "mid": 1024, "high": 4096}
BATCH, FEATURES, HIDDEN = 64, 256, 256


def build_model(classes: int) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, classes))


def train_step(model, opt, x, y, history):
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    history.append(logits.softmax(dim=1).amax(dim=1).mean().detach())
    return loss.detach()


def main():
    args = parse_args(__doc__)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    classes = CLASSES[args.severity]
    model = build_model(classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    data = [(torch.randn(BATCH, FEATURES, device=device), torch.randint(0, classes, (BATCH,), device=device))
            for _ in range(4)]
    history = []
    with profiler(args, "memory_growth_clean", profile_memory=True, classes=classes) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y, history)
            prof.step()
    print(f"memory_growth_clean: last loss {last.item():.4f}, kept {len(history)} values")


if __name__ == "__main__":
    main()
