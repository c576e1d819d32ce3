"""benchmarks/bench_peers_trace.py runs end to end in its tiny mode on real traces: the report's
structure, and that its counts add up (every labelled (trace, pattern) scored once per tool)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import REPO, load_labels

BENCH = REPO / "benchmarks" / "bench_peers_trace.py"
OUTCOMES = {"TP", "FP", "FN", "TN", "NV"}


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def tiny(shared_traces, tmp_path_factory) -> tuple[dict, str]:
    if importlib.util.find_spec("hta") is None:
        pytest.skip("HTA is not installed (pip install traceinsight): the benchmark compares against it")
    out = tmp_path_factory.mktemp("peers") / "peers.json"
    proc = _run("--tiny", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def test_tiny_run_structure(tiny):
    doc, stdout = tiny
    sys.path.insert(0, str(BENCH.parent))
    import bench_peers_trace as bench

    labels = load_labels()
    assert doc["tools"] == ["zoomer", "hta"]
    assert [r["rel"] for r in doc["results"]] == bench.TINY_TRACES
    for r in doc["results"]:
        label = labels[r["rel"]]
        assert r["labels"] == {p: True for p in label.get("positive") or []} | {p: False for p in label.get("negative") or []}
        for tool in doc["tools"]:
            run = r["runs"][tool]
            assert run["opened"] and run["error"] is None, (r["rel"], tool, run["error"])
            assert run["seconds"] > 0
            assert set(r["outcomes"][tool]) == set(r["labels"]) and set(r["outcomes"][tool].values()) <= OUTCOMES
        for pattern in bench.HTA_CANNOT_DECIDE:  # patterns HTA has no analysis for get no verdict from it
            assert r["runs"]["hta"]["verdicts"][pattern] is None
            if pattern in r["labels"]:
                assert r["outcomes"]["hta"][pattern] == "NV"
        assert set(r["figures"]) == set((label.get("expect") or {}))
        for name, row in r["figures"].items():
            assert row["expected"] == label["expect"][name]
            for tool in doc["tools"]:
                assert set(row[tool]) == {"value", "error", "within"}
    assert doc["tracelens"]["run"] is False and doc["tracelens"]["why"]
    for heading in ("== per pattern and tool", "== expect figures", "== cases where a peer is right and Zoomer wrong",
                    "== HTA: traces it could not open", "== TraceLens (AMD): not run", "== time"):
        assert heading in stdout


def test_tiny_run_counts_add_up(tiny):
    doc, _ = tiny
    for tool in doc["tools"]:
        for pattern, per_tool in doc["scores"].items():
            s = per_tool[tool]
            marked = [r["outcomes"][tool][pattern] for r in doc["results"] if pattern in r["labels"]]
            assert s["labels"] == len(marked) == sum(s[k] for k in OUTCOMES)
            assert all(s[k] == marked.count(k) for k in OUTCOMES), (pattern, tool, s, marked)
            positives = sum(r["labels"][pattern] for r in doc["results"] if pattern in r["labels"])
            assert s["TP"] + s["FN"] <= positives and s["FP"] + s["TN"] <= s["labels"] - positives
            if s["TP"] + s["FN"]:
                assert s["recall"] == pytest.approx(s["TP"] / (s["TP"] + s["FN"]))
            if s["TP"] + s["FP"]:
                assert s["precision"] == pytest.approx(s["TP"] / (s["TP"] + s["FP"]))
        total = doc["totals"][tool]
        assert total["labels"] == sum(len(r["labels"]) for r in doc["results"])
        for k in OUTCOMES:
            assert total[k] == sum(per_tool[tool][k] for per_tool in doc["scores"].values())
        assert doc["time_s"][tool] == pytest.approx(sum(r["runs"][tool]["seconds"] for r in doc["results"]))


def test_unknown_trace_is_one_line_and_exit_2(shared_traces):
    proc = _run("--traces", "no/such/trace.json.gz", "--no-hta", timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "no/such/trace.json.gz" in proc.stderr


def test_hta_rules_use_zoomers_thresholds():
    """The HTA decision rules borrow their thresholds from rules/*.yaml: each borrowed number is still a
    literal of that rule's condition (a threshold changed there must be changed in the benchmark too)."""
    import re

    import yaml

    sys.path.insert(0, str(BENCH.parent))
    import bench_peers_trace as bench

    assert set(bench.ZOOMER_THRESHOLDS) | {"straggler"} == set(bench.HTA_RULES)
    assert not set(bench.HTA_RULES) & set(bench.HTA_CANNOT_DECIDE)
    for rule_id, numbers in bench.ZOOMER_THRESHOLDS.items():
        condition = yaml.safe_load((REPO / "rules" / f"{rule_id}.yaml").read_text())["condition"]
        literals = {float(x) for x in re.findall(r"(?<![\w.])\d+(?:\.\d+)?", condition)}
        assert set(numbers) <= literals, (rule_id, numbers, condition)
