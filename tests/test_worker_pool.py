"""stream/pool.py: rank files handled in spawned worker processes (the streaming reader's ranks,
analyze --steps' cuts). Ctrl-C stops the workers at once: leaving the pool used to wait for every
file already queued to a worker (an 8-rank --steps run went on cutting for minutes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _with_token(token: str) -> list[int]:
    """Processes whose environment holds the token (the runner's workers inherit it)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if token.encode() in (d / "environ").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupt_stops_the_workers_and_the_files_queued_to_them(tmp_path, how):
    """Ctrl-C (SIGINT to the whole foreground group) or SIGTERM to the command alone (a job
    scheduler's stop): the command exits within seconds (130 / 143) and no worker lives on."""
    (tmp_path / "slowmod.py").write_text(textwrap.dedent("""
        import time

        def slow(name, slot=None):
            time.sleep(60)
            return name
    """))
    runner = tmp_path / "runner.py"
    runner.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        import slowmod
        from zoomer_ar.stream.pool import run_pool
        if __name__ == "__main__":
            files = [Path(f"rank-{{i}}.json") for i in range(6)]
            print("starting", flush=True)
            run_pool(slowmod.slow, files, [(str(f),) for f in files], 2)
            print("finished", flush=True)
    """))
    token = f"ZOOMER_POOL_TEST_{uuid.uuid4().hex}"
    env = {**os.environ, "ZOOMER_POOL_TEST_TOKEN": token}
    proc = subprocess.Popen([sys.executable, str(runner)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "starting"
        deadline = time.monotonic() + 30
        while len(_with_token(token)) < 3 and time.monotonic() < deadline:  # the runner and its two workers
            time.sleep(0.1)
        assert len(_with_token(token)) >= 3, "the workers did not start"
        time.sleep(0.5)
        t = time.monotonic()
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        else:
            os.kill(proc.pid, signal.SIGTERM)  # the main process only
        proc.wait(timeout=20)
        took = time.monotonic() - t
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = proc.stderr.read()
    if how == "ctrl-c":
        assert proc.returncode != 0 and "KeyboardInterrupt" in err, err
    else:
        assert proc.returncode == 143, (proc.returncode, err)
    assert took < 10, f"took {took:.1f} s to stop"  # the queued files (60 s each) never started
    deadline = time.monotonic() + 5  # multiprocessing's resource tracker leaves once its pipe closes
    while _with_token(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _with_token(token) == [], "worker processes outlived the interrupted command"


def test_sigterm_is_taken_over_only_where_nothing_handles_it():
    """The service worker's SIGTERM handler (finish the job, then stop) stays in place while a job's
    ranks are read in the pool; where SIGTERM has its default action, it unwinds (exit 143)."""
    from zoomer_ar.sigterm import sigterm_unwinds

    def graceful(signum, frame):
        pass

    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with sigterm_unwinds():
            with pytest.raises(SystemExit) as stop:
                signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
            assert stop.value.code == 143
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        signal.signal(signal.SIGTERM, graceful)
        with sigterm_unwinds():
            assert signal.getsignal(signal.SIGTERM) is graceful
        assert signal.getsignal(signal.SIGTERM) is graceful
    finally:
        signal.signal(signal.SIGTERM, before)
