"""launch_bound_clean: twin of launch_bound.py with the training step in a CUDA graph.

The whole step (forward, loss, backward, SGD update) is captured once with `torch.cuda.graph` on
static input tensors (after warm-up iterations on a side stream, as torch.cuda.graphs' whole-network
recipe does) and replayed every step: each step copies its batch into the static inputs and issues
one `cudaGraphLaunch`, and the GPU runs the step's kernels back to back. On a CPU (no graphs) it
runs the step eagerly.
--severity sets the layers as in launch_bound.py (low 8, mid 16, high 32).
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

LAYERS = {"low": 8, "mid": 16, "high": 32}
BATCH, WIDTH, CLASSES = 64, 256, 16
WARMUP_ITERS = 3


def build_model(layers: int) -> nn.Module:
    blocks = [m for _ in range(layers) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())]
    return nn.Sequential(*blocks, nn.Linear(WIDTH, CLASSES))


def train_step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


def graphed_step(model, opt, static_x, static_y):
    """Capture train_step on static_x/static_y; returns (replay, static loss)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_ITERS):
            train_step(model, opt, static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = train_step(model, opt, static_x, static_y)
    return graph.replay, static_loss


def main():
    args = parse_args(__doc__)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model(LAYERS[args.severity]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    data = [(torch.randn(BATCH, WIDTH, device=device), torch.randint(0, CLASSES, (BATCH,), device=device))
            for _ in range(4)]
    static_x, static_y = data[0][0].clone(), data[0][1].clone()
    replay, static_loss = graphed_step(model, opt, static_x, static_y) if device.type == "cuda" else (None, None)
    with profiler(args, "launch_bound_clean", layers=LAYERS[args.severity]) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            if replay is not None:
                static_x.copy_(x)
                static_y.copy_(y)
                replay()
                last = static_loss
            else:
                last = train_step(model, opt, x, y)
            prof.step()
    print(f"launch_bound_clean: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
