"""`zoomer-ar batch` on Dask: a LocalCluster of two worker processes by default, or an existing cluster by
address; the analyses land in the store; a failing trace is reported and the others are done."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from zoomer_ar.store.db import dispose_engine, open_store, read_session
from zoomer_ar.store.orm import Analysis, Job

from service_testutil import REPO, RESNET_NW0, shared_trace, zoomer

EXAMPLES = REPO / "examples" / "traces"


def _analyses(db: str) -> list[tuple[str, str | None]]:
    try:
        with read_session(open_store(db)) as s:
            return s.execute(select(Job.name, Job.team).join(Analysis, Analysis.job_id == Job.id)).all()
    finally:
        dispose_engine(db)


def test_batch_on_a_local_cluster_survives_a_failing_trace(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"nodes": [], "schema": "execution trace"}')
    # two inputs named sync_point (a CPU and a GPU recording): two report folders, neither overwritten
    good = [EXAMPLES / "dataloader_bound", EXAMPLES / "sync_point", shared_trace(RESNET_NW0),
            REPO / "examples" / "gpu" / "sync_point"]
    db = f"sqlite:///{tmp_path / 'store.db'}"
    out = zoomer("batch", *map(str, good), str(bad), str(tmp_path / "missing.json"), "--db", db, "--team", "perf",
                 "--workers", "2", "--out", str(tmp_path / "reports"), "--no-progress", timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr  # some failed, the rest done
    text = out.stdout + out.stderr
    assert "batch: 4 analysed, 2 failed" in out.stdout and "on 2 workers (LocalCluster)" in out.stdout
    assert "execution trace" in text and "missing.json: not found" in text
    assert text.count("ok     ") == 4 and "[5/5]" in text
    rows = _analyses(db)
    assert sorted(name for name, _ in rows) == ["dataloader_bound", "resnet50_num_workers_0", "sync_point", "sync_point"]
    assert {team for _, team in rows} == {"perf"}
    import json

    written = {json.loads((tmp_path / "reports" / d / "findings.json").read_text())["job"]["path"]
               for d in ("sync_point", "sync_point-2")}
    assert written == {str(EXAMPLES / "sync_point"), str(REPO / "examples" / "gpu" / "sync_point")}
    assert all((tmp_path / "reports" / d / "report.html").is_file() for d in ("sync_point", "sync_point-2"))


def test_batch_on_an_existing_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None)
    try:
        db = f"sqlite:///{tmp_path / 'store.db'}"
        out = zoomer("batch", str(EXAMPLES / "extra_copy"), str(EXAMPLES / "fp32_matmul"), "--db", db,
                     "--scheduler", cluster.scheduler_address, "--no-progress", timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"on 2 workers ({cluster.scheduler_address})" in out.stdout
        with distributed.Client(cluster) as client:  # the tasks ran on the cluster's workers
            logs = client.run(lambda: __import__("sys").modules.get("zoomer_ar.analyze") is not None)
        assert any(logs.values())
        assert len(_analyses(db)) == 2
    finally:
        cluster.close()


def test_bench_batch_runs(tmp_path):
    """benchmarks/bench_batch.py end to end in a tiny mode (no timing asserted)."""
    import subprocess
    import sys

    from service_testutil import env_for_subprocess

    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_batch.py"), "--traces",
                          str(EXAMPLES / "sync_point"), "--copies", "2", "--workers", "1", "2"],
                         capture_output=True, text=True, timeout=600, env=env_for_subprocess(), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "workers  seconds  traces/s  speed-up" in out.stdout
    assert "(0 failed)" in out.stdout and "      2 " in out.stdout


def test_batch_with_a_scheduler_address_dask_does_not_take_is_a_usage_error(tmp_path):
    """--scheduler garbage (no port, an http:// URL) was an internal error (ValueError from distributed,
    exit 1); now it is one line naming the option and the address, exit 2."""
    for address in ("garbage", "http://127.0.0.1:8786"):
        out = zoomer("batch", str(EXAMPLES / "sync_point"), "--scheduler", address, "--no-record", "--no-progress",
                     timeout=120)
        assert out.returncode == 2, out.stderr
        assert f"--scheduler {address}: not a Dask scheduler address" in out.stderr
        assert "internal error" not in out.stderr


def test_batch_on_a_cluster_without_workers_is_one_line(tmp_path, monkeypatch, capsys):
    """A scheduler no worker joins ended in 'internal error: WorkerStartTimeoutError: Only 0/1 workers
    arrived after 120'; now it is one line naming the scheduler, exit 1 (the cluster, not the input)."""
    distributed = pytest.importorskip("distributed")
    from zoomer_ar.cli import main
    from zoomer_ar.service import batch

    monkeypatch.setattr(batch, "WORKER_WAIT_S", 2.0)
    cluster = distributed.LocalCluster(n_workers=0, processes=True, host="127.0.0.1", dashboard_address=None)
    try:
        rc = main(["batch", str(EXAMPLES / "sync_point"), "--scheduler", cluster.scheduler_address, "--no-record",
                   "--no-progress"])
    finally:
        cluster.close()
    err = capsys.readouterr().err
    assert rc == 1 and f"the Dask scheduler {cluster.scheduler_address} has no worker: none joined in 2 s" in err
    assert "internal error" not in err


def test_batch_counts_the_workers_that_joined_while_it_waited(tmp_path, capsys):
    """The summary counted the cluster's workers before waiting for the first one: a cluster whose worker
    joined during the wait read 'on 0 workers'; now the count is taken after the wait."""
    import threading

    distributed = pytest.importorskip("distributed")
    from zoomer_ar.cli import main

    cluster = distributed.LocalCluster(n_workers=0, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None)
    timer = threading.Timer(1.0, lambda: cluster.scale(1))
    timer.start()
    try:
        rc = main(["batch", str(EXAMPLES / "sync_point"), "--scheduler", cluster.scheduler_address, "--no-record",
                   "--no-progress"])
    finally:
        timer.join()
        cluster.close()
    out = capsys.readouterr().out
    assert rc == 0 and f"on 1 worker ({cluster.scheduler_address})" in out, out


def test_batch_starts_no_more_workers_than_paths(tmp_path):
    """--workers 64 for one trace started 64 worker processes (on a 2-core machine it did not finish in a
    minute); now the LocalCluster has at most one worker per PATH."""
    out = zoomer("batch", str(EXAMPLES / "sync_point"), "--workers", "4", "--no-record", "--no-progress", timeout=300)
    assert out.returncode == 0, out.stderr
    assert "on 1 worker (LocalCluster)" in out.stdout, out.stdout


def test_batch_failure_lines_name_the_path_once_and_what_failed(tmp_path):
    """A bad trace's line read 'FAILED empty.json: empty.json: empty file' (the input error's message
    already names the file), and reports that could not be written 'recording failed: OutputError: cannot
    write ...'; now the path is said once and the failed step is named."""
    import json

    empty = tmp_path / "empty.json"
    empty.write_text("")
    earlier = tmp_path / "r" / "sync_point"  # this input's earlier reports, where report.md cannot be replaced
    (earlier / "report.md").mkdir(parents=True)
    (earlier / "report.md" / "keep").write_text("in the way")
    (earlier / "findings.json").write_text(json.dumps({"job": {"path": str(EXAMPLES / "sync_point")}}))
    out = zoomer("batch", str(empty), str(EXAMPLES / "sync_point"), "--no-record", "--out", str(tmp_path / "r"),
                 "--no-progress", timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"  failed: {empty}: empty file\n" in out.stdout and f"FAILED {empty}: empty file" in out.stderr
    assert f"  failed: {EXAMPLES / 'sync_point'}: writing the reports failed: cannot write" in out.stdout, out.stdout
    assert "recording failed" not in out.stdout and "OutputError" not in out.stdout


def test_batch_analyses_a_trace_named_twice_once(tmp_path):
    """`batch a b a` (or a path and a symlink to it) analysed and reported the same trace twice; it is analysed
    once, with a note naming the repeat."""
    trace = EXAMPLES / "sync_point"
    link = tmp_path / "again"
    link.symlink_to(trace)
    out = zoomer("batch", str(trace), str(link), str(trace), "--no-record", "--no-progress", timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("batch: 1 analysed, 0 failed"), out.stdout
    assert out.stderr.count("analysed once") == 2 and f"{link} is {trace} again" in out.stderr, out.stderr
