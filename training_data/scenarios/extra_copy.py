"""extra_copy: redundant tensor copies every step.

Three planted copies in the model's forward, each a real memory copy in the trace even on a CPU:
* a dtype round trip plus a clone of the input, which forward only reads (`.float()` copies nothing):
  `x.float().to(torch.float64).to(torch.float32).clone()` -> `aten::to` -> `aten::_to_copy` ->
  `aten::copy_` (twice) and `aten::clone` -> `aten::copy_`;
* `.transpose(1, 2).contiguous().transpose(1, 2)`: a contiguous copy nothing needed
  (`aten::contiguous` -> `aten::clone` -> `aten::copy_`);
* a buffer built on the host and then moved, `torch.zeros(...).to(x.device)`: on a GPU this is an
  `aten::zeros` plus a host-to-device `aten::copy_` (on a CPU the `.to` is a no-op; the line is there
  so the same program shows the copy when run on a GPU).
--severity sets the sequence length, i.e. how many bytes each copy moves: low 16, mid 64, high 256
(the model pools over the sequence first, so its own compute does not change).
Clean twin: extra_copy_clean.py.
"""

import torch
import torch.nn.functional as F
from torch import nn

from _common import parse_args, profiler

SEQ_LEN = {"low": 16, "mid": 64, "high": 256}
BATCH, FEATURES, HIDDEN, CLASSES = 64, 256, 256, 64


class PooledMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES + 64, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))

    def forward(self, x):
        x = x.float().to(torch.float64).to(torch.float32).clone()
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
        pad = torch.zeros(x.shape[0], 64).to(x.device)
        pooled = x.mean(dim=1)
        return self.net(torch.cat([pooled, pad], dim=1))


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
    seq = SEQ_LEN[args.severity]
    model = PooledMLP().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    data = [(torch.randn(BATCH, seq, FEATURES, device=device), torch.randint(0, CLASSES, (BATCH,), device=device))
            for _ in range(4)]
    with profiler(args, "extra_copy", seq_len=seq) as prof:
        for step in range(prof.total_steps):
            x, y = data[step % len(data)]
            last = train_step(model, opt, x, y)
            prof.step()
    print(f"extra_copy: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
