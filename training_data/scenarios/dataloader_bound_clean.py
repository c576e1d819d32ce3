"""dataloader_bound_clean: twin of dataloader_bound.py with 2 persistent DataLoader workers.

`num_workers=2, persistent_workers=True, prefetch_factor=2` decode and augment batches in two
worker processes while the main process trains, so `__next__`
(`enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__`) mostly just picks up a ready
batch. `pin_memory=False` because there is no GPU to copy to (use True when training on a GPU).
Both programs train with one intra-op thread (the --threads default), so on a 2-core machine one
core is left for the workers.
--severity sets the blur kernel size as in dataloader_bound.py (low 3, mid 5, high 11); at
high the input work outgrows what two workers can hide on two cores.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from _common import parse_args, profiler

BLUR_KERNEL = {"low": 3, "mid": 5, "high": 11}
BATCH, SIZE, CROP, CLASSES = 32, 96, 64, 64


class SyntheticImages(Dataset):
    """Images 'decoded' from a per-index seed, then augmented: all the work is in __getitem__."""

    def __init__(self, n: int, blur: int):
        self.n, self.blur = n, blur
        self.kernel = torch.full((3, 1, blur, blur), 1.0 / (blur * blur))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        img = torch.rand(1, 3, SIZE, SIZE, generator=g)
        img = F.conv2d(F.pad(img, (self.blur // 2,) * 4, mode="reflect"), self.kernel, groups=3)
        top, left = (i * 7) % (SIZE - CROP + 1), (i * 13) % (SIZE - CROP + 1)
        img = img[0, :, top:top + CROP, left:left + CROP]
        if i % 2:
            img = img.flip(-1)
        img = (img - img.mean(dim=(1, 2), keepdim=True)) / (img.std(dim=(1, 2), keepdim=True) + 1e-5)
        return img, i % CLASSES


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, CLASSES),
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
    model = build_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    ds = SyntheticImages(64 * BATCH, BLUR_KERNEL[args.severity])
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2, persistent_workers=True, prefetch_factor=2, pin_memory=False)
    with profiler(args, "dataloader_bound_clean", blur_kernel=BLUR_KERNEL[args.severity]) as prof:
        for step, (x, y) in enumerate(loader):
            last = train_step(model, opt, x.to(device), y.to(device))
            prof.step()
            if prof.done:
                break
    print(f"dataloader_bound_clean: last loss {last.item():.4f}")


if __name__ == "__main__":
    main()
