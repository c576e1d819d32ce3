"""`models promote` of the version already current answered "nothing to do" without looking at it: a current
model whose booster was truncated since (analyses silently fall back to the rules) was reported fine. It is now
loaded as analyses load it, and said to load, or refused in one line naming the broken file."""

from __future__ import annotations

import json

import pytest

from zoomer_ar.cli import main
from zoomer_ar.learn import registry

from test_learn_audit_fixes import make_corpus, make_fake_real, train_into


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    return make_fake_real(tmp_path_factory.mktemp("real"))


def _cli(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_promoting_the_current_version_checks_that_it_loads(tmp_path, real, capsys):
    traces, cache = real
    root = tmp_path / "models"
    train_into(root, make_corpus(tmp_path / "c", 200), real)
    opts = ["--models", root, "--traces", traces, "--cache", cache]
    assert _cli(capsys, "models", "promote", "v0001", *opts)[0] == 0
    n = len(json.loads((root / "v0001" / "meta.json").read_text())["labels"])
    rc, out, _ = _cli(capsys, "models", "promote", "v0001", "--force", *opts)
    assert rc == 0 and f"v0001 is already the current model and loads ({n} boosters): nothing to do" in out

    history = (root / "HISTORY.jsonl").read_text()
    booster = root / "v0001" / "idle-gpu.txt"
    booster.write_text(booster.read_text()[:2000])  # truncated since it was promoted
    for force in ([], ["--force"]):
        rc, out, err = _cli(capsys, "models", "promote", "v0001", *force, *opts)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err and "nothing to do" not in out
        assert str(booster) in lines[0] and "v0001 is the current model but does not load" in lines[0]
    assert registry.current(root) == "v0001" and (root / "HISTORY.jsonl").read_text() == history

