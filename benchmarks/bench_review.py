"""Time `zoomer-ar review` on a 1,000-file diff.

    python benchmarks/bench_review.py                  # 1,000 changed files, a mixed ML code base
    python benchmarks/bench_review.py --files 200 --jobs 1
    python benchmarks/bench_review.py --worst          # every file a training script whose loop changed

The generated repository (in a temporary folder, removed afterwards) looks like a PyTorch code
base: model files (nn.Module classes), data modules (datasets, DataLoaders), plain utilities,
training scripts and tests, 120 to 400 lines each. The feature branch edits every file (a changed
constant inside a function, a new helper), and plants anti-patterns on changed lines in one
training script in ten. "Mixed" is that code base; "--worst" makes every file a training script
with its loop edited, so no file can be skipped without parsing it. The time covers the whole
review: git diff, reading blobs, the prefilter, parsing and fixers, SARIF and Markdown rendering.
Figures are printed, never invented: docs/review.md quotes this script's output.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GIT_ENV = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid", "GIT_COMMITTER_NAME": "bench",
           "GIT_COMMITTER_EMAIL": "bench@example.invalid", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, env={**os.environ, **GIT_ENV}, check=True, capture_output=True)


def _filler(rng: random.Random, n: int, tag: str) -> str:
    out = []
    for i in range(n):
        k = rng.randint(1, 9)
        out.append(
            f"\n\ndef {tag}_helper_{i}(values, scale={k}):\n"
            f'    """Helper {i}."""\n'
            f"    out = []\n"
            f"    for v in values:\n"
            f"        if v > {k}:\n"
            f"            out.append(v * scale)\n"
            f"        else:\n"
            f"            out.append(v - {k})\n"
            f"    return out\n"
        )
    return "".join(out)


def model_file(rng: random.Random, i: int) -> str:
    blocks = "".join(
        f"\n\nclass Block{i}_{b}(nn.Module):\n"
        f"    def __init__(self, dim={64 * (b + 1)}):\n"
        f"        super().__init__()\n"
        f"        self.proj = nn.Linear(dim, dim)\n"
        f"        self.norm = nn.LayerNorm(dim)\n"
        f"        self.drop = nn.Dropout(0.1)\n\n"
        f"    def forward(self, x):\n"
        f"        y = self.proj(self.norm(x))\n"
        f"        y = torch.relu(y)\n"
        f"        return x + self.drop(y)\n"
        for b in range(rng.randint(4, 10))
    )
    return f'"""Model {i}."""\nimport torch\nimport torch.nn as nn\n{blocks}{_filler(rng, rng.randint(4, 12), f"m{i}")}\n'


def data_file(rng: random.Random, i: int) -> str:
    return (
        f'"""Data {i}."""\nimport torch\nfrom torch.utils.data import DataLoader, Dataset\n\n\n'
        f"class Set{i}(Dataset):\n    def __init__(self, n={1000 + i}):\n        self.n = n\n\n"
        f"    def __len__(self):\n        return self.n\n\n"
        f"    def __getitem__(self, k):\n        return torch.full((8,), float(k)), k % 10\n\n\n"
        f"def make_loader(batch_size=64):\n"
        f"    return DataLoader(Set{i}(), batch_size=batch_size, shuffle=True, num_workers=8, pin_memory=True)\n"
        f"{_filler(rng, rng.randint(8, 20), f'd{i}')}\n"
    )


def util_file(rng: random.Random, i: int) -> str:
    return f'"""Utilities {i}."""\nimport json\nimport os\n{_filler(rng, rng.randint(10, 30), f"u{i}")}\n'


def train_file(rng: random.Random, i: int) -> str:
    return (
        f'"""Train {i}."""\nimport torch\nfrom torch.utils.data import DataLoader\n\n\n'
        f"def train(model, dataset, epochs=1):\n"
        f"    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=8, pin_memory=True)\n"
        f"    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)\n"
        f"    total = torch.zeros(())\n"
        f"    for step, (x, y) in enumerate(loader):\n"
        f"        opt.zero_grad(set_to_none=True)\n"
        f"        loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        f"        loss.backward()\n"
        f"        opt.step()\n"
        f"        total += loss.detach()\n"
        f"    return total\n"
        f"{_filler(rng, rng.randint(6, 16), f't{i}')}\n"
    )


def test_file(rng: random.Random, i: int) -> str:
    cases = "".join(f"\n\ndef test_case_{i}_{k}():\n    assert {k} + 1 == {k + 1}\n" for k in range(rng.randint(10, 40)))
    return f'"""Tests {i}."""\nimport pytest\n{cases}\n'


KINDS = [("models", model_file, 40), ("data", data_file, 25), ("utils", util_file, 20), ("train", train_file, 10), ("tests", test_file, 5)]


def edit(text: str, rng: random.Random, kind: str, plant: bool) -> str:
    """The feature branch's change: a constant inside a function, a new helper, maybe anti-patterns."""
    lines = text.split("\n")
    candidates = [k for k, line in enumerate(lines) if "out.append(v - " in line]
    if candidates:
        k = rng.choice(candidates)
        lines[k] = lines[k].replace("out.append(v - ", "out.append(v + ")
    text = "\n".join(lines)
    if kind == "train":
        text = text.replace("    return total\n", "    print('done', float(total))\n    return total\n", 1)
        if plant:
            text = text.replace("num_workers=8, pin_memory=True)", ")", 1)
            text = text.replace("foreach=True", "foreach=False", 1)
            text = text.replace("        total += loss.detach()\n", "        total += loss.detach()\n        print(step, loss.item())\n", 1)
    return text + f"\n\ndef added_in_feature(x):\n    return x * {rng.randint(2, 9)}\n"


def build(root: Path, n: int, worst: bool, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    files: list[tuple[str, str, str]] = []
    weights = [w for _, _, w in KINDS]
    for i in range(n):
        kind, make, _ = KINDS[3] if worst else rng.choices(KINDS, weights)[0]
        files.append((f"src/{kind}/mod_{i:04d}.py", kind, make(rng, i)))
    root.mkdir(parents=True)
    _git(root, "init", "-q", "-b", "main")
    for path, _, text in files:
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "base")
    _git(root, "checkout", "-q", "-b", "feature")
    planted = 0
    lines = 0
    for path, kind, text in files:
        plant = kind == "train" and (worst or rng.random() < 0.1)
        planted += plant
        new = edit(text, rng, kind, plant)
        lines += new.count("\n")
        (root / path).write_text(new)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "feature")
    return {"files": n, "planted_files": planted, "lines": lines}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--worst", action="store_true", help="every file a training script whose loop changed")
    ap.add_argument("--jobs", type=int, default=None, help="parsing processes (default: CPU count, at most 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="time the review this many times (the best is reported too)")
    args = ap.parse_args(argv)

    from zoomer_ar.fix.registry import load_registry
    from zoomer_ar.review import review
    from zoomer_ar.review.render import render_markdown
    from zoomer_ar.review.sarif import to_sarif

    load_registry()  # fixer files loaded once, as in a CLI run (not part of a review's time)
    tmp = Path(tempfile.mkdtemp(prefix="zoomer-bench-review-"))
    try:
        t0 = time.perf_counter()
        info = build(tmp / "repo", args.files, args.worst, args.seed)
        build_s = time.perf_counter() - t0
        times = []
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            result = review(tmp / "repo", "main", "feature", jobs=args.jobs)
            to_sarif(result)
            render_markdown(result)
            times.append(time.perf_counter() - t0)
        mode = "worst case (every file a training script, loop edited)" if args.worst else "mixed ML code base"
        print(f"bench_review: {info['files']:,} changed files ({info['lines']:,} lines), {mode}; "
              f"{os.cpu_count()} CPUs, jobs={args.jobs or min(os.cpu_count() or 1, 8)}")
        print(f"  repository built in {build_s:.1f} s")
        print(f"  review: {times[0]:.2f} s" + (f" (best of {len(times)}: {min(times):.2f} s)" if len(times) > 1 else ""))
        print(f"  files reviewed {result.files_reviewed:,}, parsed by the fixers {result.files_parsed:,}, "
              f"findings {len(result.findings):,} (planted in {info['planted_files']} files), errors {len(result.errors)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
