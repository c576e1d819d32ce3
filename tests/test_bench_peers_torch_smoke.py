"""benchmarks/bench_peers_torch.py runs end to end in its tiny mode: the output has its parts and
the counts add up (nothing about the figures themselves is asserted)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import yaml

from conftest import REPO

BENCH = REPO / "benchmarks" / "bench_peers_torch.py"
MANIFEST = REPO / "training_data" / "scenarios" / "MANIFEST.yaml"
SCENARIOS = ("zero_grad_not_none", "zero_grad_not_none_clean")
TOOLS = ("pattern-matcher", "torchfix", "zoomer-trace", "zoomer-fix", "zoomer-fix+opt-in", "zoomer")

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (make setup installs it)"),
    pytest.mark.skipif(importlib.util.find_spec("torchfix") is None,
                       reason="needs torchfix (pip install --no-deps torchfix==0.7.0; make setup installs it)"),
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("peers")
    out = tmp / "peers.json"
    args = [sys.executable, str(BENCH), "--tiny", "--scenarios", ",".join(SCENARIOS), "--json", str(out)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def test_every_tool_ran_on_every_scenario(tiny_run):
    stdout, doc = tiny_run
    assert [s["name"] for s in doc["scenarios"]] == list(SCENARIOS)
    for s in doc["scenarios"]:
        assert s["record"]["ok"], s["record"]
        assert set(s["tools"]) == set(TOOLS), s["name"]
        for tool, result in s["tools"].items():
            assert result["error"] is None, (s["name"], tool, result["error"])
            assert result["wall_s"] >= 0
            assert set(result["detected"]) <= set(doc["pattern_ids"]), (tool, result["detected"])
    for heading in ("## Per tool and pattern", "## Peer right, Zoomer wrong", "## Wall time",
                    "## What a peer reports that has no Zoomer id"):
        assert heading in stdout
    for tool in TOOLS:
        assert tool in doc["timing"] and doc["timing"][tool]["runs"] == len(SCENARIOS)


def test_counts_add_up(tiny_run):
    _, doc = tiny_run
    entries = yaml.safe_load(MANIFEST.read_text())["scenarios"]
    planted = sum(entries[n]["pattern"] != "clean" for n in SCENARIOS)
    judged = planted + sum(len(entries[n]["must_not_show"]) for n in SCENARIOS)
    for tool in TOOLS:
        per = doc["scores"][tool]
        total = per["total"]
        for key in total:
            assert total[key] == sum(per[p][key] for p in doc["pattern_ids"]), (tool, key)
        assert total["tp"] + total["fn"] == planted, tool  # each planted program has one planted id
        assert total["tp"] + total["fp"] + total["fn"] + total["tn"] == judged, tool
        # the table's verdicts are the per-scenario detections, judged against the manifest
        hits = sum(len(s["tools"][tool]["detected"]) for s in doc["scenarios"])
        assert hits == total["tp"] + total["fp"] + total["not-judged"], tool


def test_peer_right_cases_are_consistent_with_the_scores(tiny_run):
    _, doc = tiny_run
    for case in doc["peer_right_zoomer_wrong"]:
        assert case["peer"] in ("pattern-matcher", "torchfix")
        assert case["peer_verdict"] in ("tp", "tn")
        assert any(v in ("fn", "fp") for v in case["zoomer"].values()), case


def test_unknown_scenario_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH), "--scenarios", "no_such_program"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "unknown scenario" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
