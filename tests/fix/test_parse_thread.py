"""parse_in_big_stack runs every parse on one long-lived big-stack thread: callers on several
threads get their own results and errors, and a forked child starts a thread of its own."""

from __future__ import annotations

import os
import threading

import libcst as cst
import pytest

from zoomer_ar.fix import nesting
from zoomer_ar.fix.nesting import parse_in_big_stack


def test_one_thread_serves_every_parse():
    parse_in_big_stack(lambda: cst.parse_module("x = 1\n"))
    first = nesting._PARSER[1]
    for i in range(20):
        assert parse_in_big_stack(lambda i=i: cst.parse_module(f"y = {i}\n")).code == f"y = {i}\n"
    assert nesting._PARSER[1] is first and first.name == "zoomer-parse"
    assert sum(t.name == "zoomer-parse" for t in threading.enumerate()) == 1


def test_callers_on_many_threads_get_their_own_results_and_errors():
    out: dict[int, object] = {}

    def work(k: int) -> None:
        try:
            out[k] = parse_in_big_stack(lambda: cst.parse_module(f"v{k} = {k}\n" if k % 3 else "def (:\n"))
        except cst.ParserSyntaxError as exc:
            out[k] = exc

    threads = [threading.Thread(target=work, args=(k,)) for k in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(30):
        if k % 3:
            assert isinstance(out[k], cst.Module) and out[k].code == f"v{k} = {k}\n"
        else:
            assert isinstance(out[k], cst.ParserSyntaxError)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_parses_on_a_thread_of_its_own():
    parse_in_big_stack(lambda: cst.parse_module("x = 1\n"))  # the parent's thread exists
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's parse thread did not survive the fork
        try:
            code = parse_in_big_stack(lambda: cst.parse_module("z = 2\n")).code
            ok = code == "z = 2\n" and nesting._PARSER[0] == os.getpid()
            os.write(w, b"ok" if ok else b"bad")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 16)
    os.waitpid(pid, 0)
    assert got == b"ok"


def test_the_parse_thread_does_not_stop_lightgbm_being_quieted(tmp_path, capfd):
    """learn.model._quiet_native redirects LightGBM's native "[Fatal]" line only when no other
    thread could lose its output meanwhile; the parse thread (which outlives its parses and never
    writes) is not such a thread. Found in CI: a test worker that had parsed source before printed
    the line."""
    from zoomer_ar.learn.model import SILENT_THREADS, ModelLoadError, load_booster

    parse_in_big_stack(lambda: cst.parse_module("x = 1\n"))
    assert nesting._PARSER[1].is_alive() and nesting._PARSER[1].name in SILENT_THREADS
    bad = tmp_path / "idle-gpu.txt"
    bad.write_text("tree\nversion=v4\nnum_class=1\nend of trees\n")  # complete-looking, LightGBM refuses it
    capfd.readouterr()
    with pytest.raises(ModelLoadError, match="LightGBM cannot load it"):
        load_booster(bad)
    out = capfd.readouterr()
    assert "[Fatal]" not in out.out + out.err
