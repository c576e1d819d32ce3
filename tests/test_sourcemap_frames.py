"""The job's own program as the trace shows it (sourcemap.trace_frame_files): the user files of its
Python frames, read from the raw bytes, whatever the platform that recorded it wrote as paths."""

from __future__ import annotations

import json
from pathlib import Path

from zoomer_ar.sourcemap import SourceIndex, trace_frame_files


def _trace(path: Path, names: list[str], stack: str | None = None) -> Path:
    events = [{"ph": "X", "cat": "python_function", "name": n, "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 5.0}
              for i, n in enumerate(names)]
    if stack is not None:
        events.append({"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100.0, "dur": 1.0,
                       "args": {"Call stack": stack}})
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_windows_paths_are_read_as_the_trace_wrote_them(tmp_path):
    # JSON writes C:\Users\bob\proj\train.py as C:\\Users\\bob\\proj\\train.py: those frames were left out,
    # so a finding without frames of a trace recorded on Windows was looked for in the whole folder
    trace = _trace(tmp_path / "t.json", [r"C:\Users\bob\proj\train.py(33): train_step",
                                         r"C:\Python311\Lib\site-packages\torch\nn\modules\module.py(1500): _call_impl"],
                   stack=r"C:\Users\bob\proj\model.py(12): forward;C:\Users\bob\proj\train.py(40): main")
    assert trace_frame_files([trace]) == [r"C:\Users\bob\proj\train.py", r"C:\Users\bob\proj\model.py"]
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("def train_step():\n    pass\n")
    assert SourceIndex(src).resolve(r"C:\Users\bob\proj\train.py") == (src / "train.py").resolve()


def test_posix_paths_and_escaped_quotes(tmp_path):
    # a name holding an escaped quote before the frame is no frame boundary: the file is not cut from inside it
    trace = _trace(tmp_path / "t.json", ["/home/u/proj/train.py(33): train_step", 'say "x.py(3): f"'])
    assert trace_frame_files([trace]) == ["/home/u/proj/train.py"]
