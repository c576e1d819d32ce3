"""`models promote` of the version already current answered "nothing to do" without looking at it: a current
model whose booster was truncated since (analyses silently fall back to the rules) was reported fine. It is now
loaded as analyses load it, and said to load, or refused in one line naming the broken file. And `train` settled
contrary verdicts on one trace (latest wins) without a word: it now says how many it overruled."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zoomer_ar.cli import main
from zoomer_ar.features import FEATURE_SCHEMA_VERSION
from zoomer_ar.learn import registry

from test_learn_audit_fixes import _features, make_corpus, make_fake_real, train_into


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


def _verdict(pattern: str, verdict: str, at: str, sha: str = "a" * 64) -> str:
    return json.dumps({"trace": f"/gone/{sha[:4]}.json", "job": "j", "trace_sha256": [sha], "pattern": pattern,
                       "verdict": verdict, "note": "", "at": at, "feature_schema_version": FEATURE_SCHEMA_VERSION,
                       "features": _features(np.random.default_rng(7))})


def test_train_says_how_many_verdicts_the_latest_overruled(tmp_path, real):
    labels = tmp_path / "labels.jsonl"
    labels.write_text("\n".join([
        _verdict("sync-point", "positive", "2026-01-01T00:00:00Z"),
        _verdict("sync-point", "positive", "2026-01-02T00:00:00Z"),
        _verdict("sync-point", "negative", "2026-01-03T00:00:00Z"),  # the latest: overrules the two above
        _verdict("idle-gpu", "positive", "2026-01-01T00:00:00Z"),
        _verdict("idle-gpu", "positive", "2026-01-02T00:00:00Z"),  # agrees: overrules nothing
        _verdict("sync-point", "negative", "2026-01-01T00:00:00Z", sha="b" * 64),  # another trace
        _verdict("sync-point", "positive", "2026-01-05T00:00:00Z", sha="b" * 64),
    ]) + "\n")
    said: list[str] = []
    train_into(tmp_path / "models", make_corpus(tmp_path / "c", 200), real, labels=labels, log=said.append)
    notes = [s for s in said if "overruled" in s]
    assert len(notes) == 1 and notes[0].startswith("train: note: 3 human verdicts overruled by a later, contrary verdict")
    assert "sync-point positive on aaaa.json at 2026-01-01T00:00:00Z" in notes[0]
    assert "sync-point negative on bbbb.json at 2026-01-01T00:00:00Z" in notes[0]

    labels.write_text(_verdict("idle-gpu", "positive", "2026-01-01T00:00:00Z") + "\n")
    said.clear()
    train_into(tmp_path / "models", make_corpus(tmp_path / "c", 200), real, labels=labels, log=said.append)
    assert not [s for s in said if "overruled" in s]
