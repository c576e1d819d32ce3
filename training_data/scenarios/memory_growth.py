"""memory_growth: keeps every step's confidence metric, graph attached, in a Python list.

`history.append(logits.softmax(dim=1).amax(dim=1).mean())` stores a 0-d tensor that still requires
grad: its `grad_fn` chain holds the softmax output (BATCH x CLASSES floats) that the softmax and
amax backward would need, and nothing ever back-propagates through it, so that graph is never
freed: allocated memory climbs by the size of the softmax output every step until the job runs out
of memory. Recorded with `profile_memory=True`: the `[memory]` events' `Total Allocated` rises step
after step.
--severity sets the number of classes, i.e. bytes leaked per step (BATCH x CLASSES x 4):
low 256 (64 KiB), mid 1024 (256 KiB), high 4096 (1 MiB).
Clean twin: memory_growth_clean.py (appends the same value `.detach()`ed: a 0-d tensor, no graph).
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
    history.append(logits.softmax(dim=1).amax(dim=1).mean())
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
    with profiler(args, "memory_growth", profile_memory=True, classes=classes) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y, history)
            prof.step()
    print(f"memory_growth: last loss {last.item():.4f}, kept {len(history)} values")


if __name__ == "__main__":
    main()
