"""fp32_matmul: a matmul-heavy MLP trained entirely in float32.

Every GEMM (`aten::addmm`/`aten::mm`, forward and backward) runs with float32 inputs
(`Input type` `float`). On an Ampere-or-newer GPU the fix is TF32
(`torch.set_float32_matmul_precision("high")`, i.e. `torch.backends.cuda.matmul.allow_tf32 = True`)
or bf16 autocast; on a CPU (where TF32 does not exist) it is bf16 autocast, which is what the
twin does. Note: CPUs without native bf16 (no AVX512_BF16/AMX) may run the bf16 GEMMs no faster;
the trace-level signal (GEMM dtype) is the same either way.
--severity sets the MLP width: low 256, mid 512, high 1024.
Clean twin: fp32_matmul_clean.py (`torch.autocast("cpu", dtype=torch.bfloat16)`).
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

WIDTH = {"low": 256, "mid": 512, "high": 1024}
BATCH, CLASSES = 128, 64


def build_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, width), nn.GELU(),
        nn.Linear(width, CLASSES),
    )


def train_step(model, opt, x, y):
    out = model(x)
    loss = F.cross_entropy(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


def main():
    args = parse_args(__doc__)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    width = WIDTH[args.severity]
    model = build_model(width).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    data = [(torch.randn(BATCH, width, device=device), torch.randint(0, CLASSES, (BATCH,), device=device))
            for _ in range(4)]
    with profiler(args, "fp32_matmul", width=width) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y)
            prof.step()
    print(f"fp32_matmul: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
