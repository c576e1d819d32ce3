"""`zoomer-ar trace ...` defects left open by earlier audits: an empty trace compressed (exit 0), a job
folder holding a trace beside its decompressed twin refused by merge, `sample -k` copying fewer ranks
than asked where one rank is unreadable. Each test drives the real CLI and failed before its fix."""

from __future__ import annotations

import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zoomer_ar.cli import main

from conftest import SHARED_TRACES, one_error_line, files_under

DLRM = SHARED_TRACES / "param/dlrm_8ranks"


# ---- an empty trace compressed ------------------------------------------------------------------


@pytest.mark.parametrize("doc", [b'{"traceEvents": []}', b"[]", b'{"schemaVersion": 1, "traceEvents": [ ]}'])
@pytest.mark.parametrize("out_name", ["o.json.gz", "o.json"])
def test_compress_refuses_a_trace_without_events(doc, out_name, tmp_path, capsys):
    """`analyze` refuses such a trace (exit 2); compress wrote it and exited 0."""
    src = tmp_path / "empty.json"
    src.write_bytes(doc)
    assert main(["trace", "compress", str(src), str(tmp_path / out_name)]) == 2
    one_error_line(capsys, str(src), "no events")
    assert files_under(tmp_path) == ["empty.json"]


# ---- a trace beside its decompressed twin --------------------------------------------------------


@pytest.fixture
def job_with_twin(tmp_path: Path, shared_traces) -> Path:
    """Ranks 0 and 1 of a real job, rank 0 also decompressed beside its .gz (x.json and x.json.gz)."""
    job = tmp_path / "job"
    job.mkdir()
    for pattern in ("worker0_*", "worker1_*"):
        for f in DLRM.glob(pattern):
            (job / f.name).write_bytes(f.read_bytes())
    rank0 = next(job.glob("worker0_*.json.gz"))
    (job / rank0.name[: -len(".gz")]).write_bytes(gzip.decompress(rank0.read_bytes()))
    return job


def test_merge_reads_a_trace_and_its_twin_once_as_analyze_does(job_with_twin, tmp_path, capsys):
    """merge refused the folder: 'x.json and x.json.gz are both rank 0 (distributedInfo)'."""
    out = tmp_path / "m.json.gz"
    assert main(["trace", "merge", str(job_with_twin), str(out)]) == 0
    err = capsys.readouterr().err
    assert "note: skipped" in err and "the same trace as worker0_" in err
    doc = json.loads(gzip.decompress(out.read_bytes()))
    assert doc["distributedInfo"]["merged_ranks"] == [0, 1]
    singles = sum(len(json.loads(gzip.decompress(f.read_bytes()))["traceEvents"]) for f in job_with_twin.glob("*.gz"))
    assert len(doc["traceEvents"]) == singles  # rank 0 once
    assert main(["trace", "check", str(out)]) == 0


def test_sample_reads_a_trace_and_its_twin_once(job_with_twin, tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["trace", "sample", str(job_with_twin), str(out), "-k", "2"]) == 0
    assert "the same trace as worker0_" in capsys.readouterr().err
    copied = sorted(f.name.split("_")[0] for f in out.iterdir())
    assert copied == ["worker0", "worker1"]


def test_pieces_of_one_rank_are_still_refused(tmp_path, capsys, shared_traces):
    """Two files that claim one rank and hold different events are no twins: still not one job."""
    src = next(DLRM.glob("worker0_*"))
    pieces = tmp_path / "pieces"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    events = doc["traceEvents"]
    pieces.mkdir()
    for k, part in enumerate((events[: len(events) // 2], events[len(events) // 2:])):
        (pieces / f"piece{k}.json").write_text(json.dumps({**doc, "traceEvents": part}))
    assert main(["trace", "merge", str(pieces), str(tmp_path / "m.json")]) == 2
    one_error_line(capsys, "not one job", "both rank 0")
    assert not (tmp_path / "m.json").exists()


def test_a_copy_that_differs_at_its_end_is_no_twin(tmp_path):
    from zoomer_ar.surgery.twins import same_trace

    data = gzip.decompress(next(DLRM.glob("worker0_*")).read_bytes())
    a, b, c = tmp_path / "a.json", tmp_path / "b.json.gz", tmp_path / "c.json"
    a.write_bytes(data)
    b.write_bytes(gzip.compress(data))
    c.write_bytes(data[:-1] + b" }")
    assert same_trace(a, b) and same_trace(b, a)
    assert not same_trace(a, c) and not same_trace(c, b)
    assert not same_trace(a, tmp_path / "missing.json")


# ---- sample -k with an unreadable rank among those picked ------------------------------------------


def _job_with_unreadable(tmp_path: Path, bad: tuple[int, ...], ranks: int = 8) -> Path:
    """The first `ranks` ranks of a real job; those in `bad` cut short past their first events (the
    probe of the first 64 kB passes them, the read through fails)."""
    job = tmp_path / "job"
    job.mkdir()
    for r in range(ranks):
        f = next(DLRM.glob(f"worker{r}_*"))
        data = f.read_bytes()
        (job / f.name).write_bytes(data[:30_000] if r in bad else data)
    return job


def _sampled(out: Path) -> list[int]:
    return sorted(int(f.name[len("worker")]) for f in out.iterdir())


def test_sample_k_replaces_an_unreadable_pick_with_a_readable_rank(tmp_path, capsys):
    """-k 4 of 8 picks 0, 2, 5, 7: with rank 7 unreadable, 3 files were copied (exit 0)."""
    job = _job_with_unreadable(tmp_path, bad=(7,))
    out = tmp_path / "s"
    assert main(["trace", "sample", str(job), str(out), "-k", "4"]) == 0
    err = capsys.readouterr().err
    assert "worker7_" in err and "rank 7 is unreadable: rank 6 sampled in its place" in err
    assert _sampled(out) == [0, 2, 5, 6]
    assert main(["trace", "check", str(out)]) == 0


def test_sample_k_with_a_seed_replaces_an_unreadable_pick_too(tmp_path, capsys):
    job = _job_with_unreadable(tmp_path, bad=(0, 1, 2, 3, 4, 5))
    out = tmp_path / "s"
    assert main(["trace", "sample", str(job), str(out), "-k", "2", "--seed", "1"]) == 0
    assert _sampled(out) == [6, 7]


def test_sample_k_says_when_too_few_ranks_are_readable(tmp_path, capsys):
    job = _job_with_unreadable(tmp_path, bad=(1, 2), ranks=3)
    out = tmp_path / "s"
    assert main(["trace", "sample", str(job), str(out), "-k", "2"]) == 0
    err = capsys.readouterr().err
    assert "warning: -k 2: 1 of the 2 ranks asked for copied" in err
    assert _sampled(out) == [0]


# ---- a rank file that cannot be read ------------------------------------------------------------


def _unprivileged(args: list[str]) -> subprocess.CompletedProcess:
    """The CLI run as a user whom a file's permissions stop (root reads a chmod 000 file: its
    capabilities to do so are dropped)."""
    cmd = [sys.executable, "-m", "zoomer_ar", *args]
    if os.geteuid() == 0:
        if shutil.which("capsh") is None:
            pytest.skip("root without capsh: permissions do not stop it")
        cmd = ["capsh", "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", shlex.join(cmd)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_an_unreadable_rank_is_said_to_be_unreadable(tmp_path):
    """It was skipped as 'not a trace (cannot read: [Errno 13] Permission denied: '<path>')'."""
    job = _job_with_unreadable(tmp_path, bad=(), ranks=3)
    locked = next(job.glob("worker1_*"))
    locked.chmod(0)
    try:
        run = _unprivileged(["trace", "merge", str(job), str(tmp_path / "m.json.gz")])
        assert run.returncode == 0, run.stderr
        assert f"note: skipped {locked}: cannot read (Permission denied)" in run.stderr, run.stderr
        run = _unprivileged(["trace", "check", str(job)])
        assert run.returncode == 2
        assert run.stderr.strip().endswith(f"{locked}: not a valid Chrome trace: cannot read (Permission denied)")
        assert "Errno" not in run.stdout + run.stderr
    finally:
        locked.chmod(0o644)


# ---- an empty file -------------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", [["filter", "{E}", "{T}/o.json"], ["slice", "{E}", "{T}/o.json", "--steps", "1..2"],
                                 ["split", "{E}", "{T}/o"], ["compress", "{E}", "{T}/o.json.gz"],
                                 ["repair", "{E}", "{T}/o.json"], ["check", "{E}"]])
@pytest.mark.parametrize("name", ["e.json", "e.json.gz"])
def test_an_empty_file_is_said_to_be_empty(cmd, name, tmp_path, capsys):
    """Said 'cannot stream this trace: no events array' (check: 'not a readable trace: ...'), where
    analyze and repair say 'empty file'."""
    empty = tmp_path / name
    empty.touch()
    assert main(["trace", *(a.format(E=empty, T=tmp_path) for a in cmd)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1].endswith(f"{empty}: empty file") or err.endswith("not a valid Chrome trace: empty file"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_an_empty_rank_file_is_skipped_as_empty(tmp_path, capsys):
    job = _job_with_unreadable(tmp_path, bad=(), ranks=2)
    (job / "rank9.json").touch()
    assert main(["trace", "merge", str(job), str(tmp_path / "m.json.gz")]) == 0
    assert f"note: skipped {job / 'rank9.json'}: not a trace (empty file)" in capsys.readouterr().err


# ---- trace repair of a valid trace written on one line ----------------------------------------------


def test_repair_copies_a_valid_one_line_trace_as_it_is(tmp_path, capsys, shared_traces):
    """hta/large_integer_trace holds two events on one line: the line-by-line repair took
    `"ncclKernel_AllReduce", "pid": 0, ... "name": "record_param_comms"` for one unescaped name and
    wrote a trace of one event (exit 0, '1 event name re-escaped')."""
    src = next((SHARED_TRACES / "hta/large_integer_trace").glob("*.json.gz"))
    out = tmp_path / "r.json.gz"
    assert main(["trace", "repair", str(src), str(out)]) == 0
    assert "is valid JSON: nothing to repair, copied as it is" in capsys.readouterr().err
    assert gzip.decompress(out.read_bytes()) == gzip.decompress(src.read_bytes())
