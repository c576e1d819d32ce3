"""conv_bias_before_bn: `nn.Conv2d(..., bias=True)` directly followed by `nn.BatchNorm2d`.

BatchNorm subtracts the per-channel mean right after the convolution, so the conv's bias is
cancelled exactly: it is a wasted parameter, a wasted add in forward and a wasted reduction in
backward, plus an extra tensor for the optimizer. In the trace each `aten::convolution` gets a
bias input (`Input Dims` `[..., [C]]`) and is followed by `aten::batch_norm` on the same
`nn.Module: Sequential_N` block.
--severity sets the number of conv-bn blocks: low 2, mid 4, high 8.
Clean twin: conv_bias_before_bn_clean.py (`bias=False`).
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

BLOCKS = {"low": 2, "mid": 4, "high": 8}
BATCH, CHANNELS, SIZE, CLASSES = 16, 32, 16, 64


def conv_bn_block(channels: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(channels, channels, 3, padding=1, bias=True),
        nn.BatchNorm2d(channels),
        nn.ReLU(inplace=True),
    )


def build_model(n_blocks: int) -> nn.Module:
    return nn.Sequential(
        *[conv_bn_block(CHANNELS) for _ in range(n_blocks)],
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(CHANNELS, CLASSES),
    )


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
    model = build_model(BLOCKS[args.severity]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    data = [(torch.randn(BATCH, CHANNELS, SIZE, SIZE, device=device), torch.randint(0, CLASSES, (BATCH,), device=device))
            for _ in range(4)]
    with profiler(args, "conv_bias_before_bn", blocks=BLOCKS[args.severity]) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y)
            prof.step()
    print(f"conv_bias_before_bn: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
