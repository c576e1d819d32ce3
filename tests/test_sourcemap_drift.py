"""analyze --source on a file edited since the recording (lines inserted above): a frame's function is
found again by its name; where several functions share it (every nn.Module's `forward`), the one whose
`def` lies nearest the recorded line, and on a tie the one holding the finding's statement. The
location was the recorded line itself, in other code (a blank line between the classes, `<module>`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoomer_ar.models import SourceFrame
from zoomer_ar.sourcemap import SourceIndex, _map_frame

RECORDED = '''import torch


class A(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        return y


class B(torch.nn.Module):
    def forward(self, x):
        s = x.sum().item()
        return x / s


class C(torch.nn.Module):
    def forward(self, x):
        return x - 1
'''
HEADER = "# a header written after the recording\n# and a second line\n"  # the defs 2 lines lower
TIE = HEADER + "# and a third\n"  # 3 lines lower: B's recorded def (line 11) is as near A's (8) as B's (14)


def _src(tmp_path: Path, text: str) -> SourceIndex:
    (tmp_path / "model.py").write_text(text)
    return SourceIndex(tmp_path)


def _def_line(text: str, cls: str) -> int:
    lines = text.splitlines()
    at = lines.index(f"class {cls}(torch.nn.Module):")
    return at + 2  # the def on the next line, 1-based


@pytest.mark.parametrize("header,cls,pattern,want", [
    (HEADER, "B", "sync-point", "        s = x.sum().item()"),  # B's def is nearest: its .item()
    (HEADER, "A", "sync-point", "    def forward(self, x):"),   # A's def is nearest (no .item() in A: its def)
    (HEADER, "C", "straggler", "    def forward(self, x):"),    # C's def is nearest (nothing to locate: its def)
    (TIE, "B", "sync-point", "        s = x.sum().item()"),     # A's and B's defs as near: B holds the .item()
], ids=["B", "A", "C", "tie"])
def test_a_shifted_frame_finds_its_function_among_same_named_ones(tmp_path, header, cls, pattern, want):
    index = _src(tmp_path, header + RECORDED)
    recorded = _def_line(RECORDED, cls)
    frame = _map_frame(index, SourceFrame(file="model.py", line=recorded, function="forward"), pattern)
    now = (header + RECORDED).splitlines()
    assert frame.resolved_line is not None and now[frame.resolved_line - 1] == want
    assert frame.function == "forward" and frame.line == recorded
    owner = max(i for i, line in enumerate(now[:frame.resolved_line], 1) if line.startswith("class "))
    assert now[owner - 1].startswith(f"class {cls}")


def test_a_tie_nothing_decides_claims_no_function(tmp_path):
    # C's recorded def (17) is as near B's (14) as C's (20) and neither holds anything straggler points at:
    # no guess between them (the recorded line, as before)
    index = _src(tmp_path, TIE + RECORDED)
    frame = _map_frame(index, SourceFrame(file="model.py", line=_def_line(RECORDED, "C"), function="forward"),
                       "straggler")
    assert frame.resolved_line == _def_line(RECORDED, "C")


def test_an_unshifted_frame_is_located_as_before(tmp_path):
    index = _src(tmp_path, RECORDED)
    frame = _map_frame(index, SourceFrame(file="model.py", line=_def_line(RECORDED, "B"), function="forward"),
                       "sync-point")
    assert RECORDED.splitlines()[frame.resolved_line - 1] == "        s = x.sum().item()"
