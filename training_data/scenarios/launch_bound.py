"""launch_bound: a training step of many tiny kernels, each launched from Python.

A deep, narrow MLP (LAYERS Linear+ReLU layers of 256 units) on a batch of 64: every op is a
kernel of a few microseconds, and the host spends longer dispatching and launching each one
(PyTorch's dispatcher, then `cudaLaunchKernel`) than the GPU spends running it. The GPU idles
between kernels waiting for the next launch: the trace shows GPU busy well under half of the step,
kernels shorter than their launch calls, and idle gaps that end when a launch call returns.
--severity sets the layers (kernels per step): low 8, mid 16, high 32.
Clean twin: launch_bound_clean.py (the same step captured once in a CUDA graph and replayed).
GPU only: on a CPU there are no launches and the trace shows no GPU at all.
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

LAYERS = {"low": 8, "mid": 16, "high": 32}
BATCH, WIDTH, CLASSES = 64, 256, 16


def build_model(layers: int) -> nn.Module:
    blocks = [m for _ in range(layers) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())]
    return nn.Sequential(*blocks, nn.Linear(WIDTH, CLASSES))


def train_step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


def main():
    args = parse_args(__doc__)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model(LAYERS[args.severity]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    data = [(torch.randn(BATCH, WIDTH, device=device), torch.randint(0, CLASSES, (BATCH,), device=device))
            for _ in range(4)]
    with profiler(args, "launch_bound", layers=LAYERS[args.severity]) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y)
            prof.step()
    print(f"launch_bound: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
