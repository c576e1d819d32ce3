"""clean: a well-written reference training loop with none of the planted anti-patterns.

* data already batched in memory on the device (no input pipeline to wait on);
* conv layers without bias in front of BatchNorm; GEMM sizes multiples of 64, batch of 64;
* forward under bf16 autocast (on a GPU: bf16 autocast or TF32);
* SGD with `foreach=True` (multi-tensor update), `opt.zero_grad()` (set_to_none);
* the loss is accumulated on the device and read back once, after the loop;
* nothing kept across steps: memory is flat (recorded with `profile_memory=True`).
--severity is accepted for a uniform command line and ignored.
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

BATCH, CHANNELS, SIZE, HIDDEN, CLASSES = 64, 32, 16, 256, 64


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, CHANNELS, 3, padding=1, bias=False), nn.BatchNorm2d(CHANNELS), nn.ReLU(inplace=True),
        nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1, bias=False), nn.BatchNorm2d(CHANNELS), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        nn.Linear(CHANNELS * 4, HIDDEN), nn.ReLU(inplace=True),
        nn.Linear(HIDDEN, CLASSES),
    )


def train_step(model, opt, x, y, running):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    running += loss.detach()


def main():
    args = parse_args(__doc__)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    model = build_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    data = [(torch.randn(BATCH, 3, SIZE, SIZE, device=device), torch.randint(0, CLASSES, (BATCH,), device=device))
            for _ in range(4)]
    running = torch.zeros((), device=device)
    with profiler(args, "clean", profile_memory=True) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            train_step(model, opt, x, y, running)
            prof.step()
    print(f"clean: mean loss {running.item() / prof.total_steps:.4f}")


if __name__ == "__main__":
    main()
