"""`analyze --annotate OUT`: an output that is one of the job's own trace files is refused, however it
is named, before anything is read or written; nothing of the original is lost."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from zoomer_ar.analyze import analyze_path
from zoomer_ar.annotate import annotate
from zoomer_ar.cli import main
from zoomer_ar.errors import InputError

from conftest import one_error_line
from test_merged_trace import rank_trace


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture
def linked_job(tmp_path) -> tuple[Path, Path]:
    """Rank files kept in `store/`, and a job folder `job/` of symbolic links to them (ranks picked
    for an analysis without copying them)."""
    store, job = tmp_path / "store", tmp_path / "job"
    store.mkdir()
    job.mkdir()
    for r, slow in ((0, 1.0), (1, 2.5)):
        name = f"rank-{r}.json"
        (store / name).write_text(json.dumps(rank_trace(r, slow)))
        (job / name).symlink_to(Path("..") / "store" / name)
    return store, job


@pytest.mark.parametrize("out", ["store", "store/rank-0.json"], ids=["folder", "file"])
def test_annotating_a_job_of_links_onto_the_files_they_name_is_refused(linked_job, out, capsys):
    # the annotated copies were written over store/rank-*.json (the link targets): the originals replaced
    store, job = linked_job
    before = _digests(store)
    target = store.parent / out
    assert main(["analyze", str(job), "--no-files", "--no-progress", "--annotate", str(target)]) == 2
    one_error_line(capsys, str(target), "is the input", "rank-0.json")
    assert _digests(store) == before


def test_annotate_itself_refuses_to_write_over_a_rank_file(linked_job):
    # the library call refuses too (it is the last step before the files are written)
    store, job = linked_job
    before = _digests(store)
    analysis = analyze_path(job)
    with pytest.raises(InputError, match="is the input"):
        annotate(analysis, store)
    assert _digests(store) == before


def test_annotating_a_job_of_links_elsewhere_still_works(linked_job, tmp_path):
    store, job = linked_job
    before = _digests(store)
    out = tmp_path / "annotated"
    assert main(["analyze", str(job), "--no-files", "--no-progress", "--annotate", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["rank-0.json", "rank-1.json"]
    assert _digests(store) == before
