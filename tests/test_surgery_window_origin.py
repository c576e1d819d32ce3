"""`trace slice --window` counts milliseconds from the rank's first complete event (the origin of
evidence times), not from its first event: hta/ns_resolution_trace has events 95 ms before that one,
and the refusal of an empty window said its events span "-95.342.. ms from its first event"."""

from __future__ import annotations

import gzip
import json

from zoomer_ar.cli import main

from conftest import SHARED_TRACES, one_error_line

NS = SHARED_TRACES / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"


def test_the_window_starts_at_the_first_complete_event(tmp_path, capsys, shared_traces):
    events = json.loads(gzip.decompress(NS.read_bytes()))["traceEvents"]
    first_x = min(e["ts"] for e in events if e.get("ph") == "X" and e.get("cat") != "Trace")
    assert min(e["ts"] for e in events if "ts" in e and e.get("cat") != "Trace") < first_x - 90_000  # 90 ms before
    out = tmp_path / "w.json"
    assert main(["trace", "slice", str(NS), str(out), "--window", "0..0.001"]) == 0
    kept = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert any(e["ts"] == first_x for e in kept)
    capsys.readouterr()
    assert main(["trace", "slice", str(NS), str(out), "--window", "-5..-1"]) == 2
    one_error_line(capsys, "its events span -95.342..", "ms from its first complete event")
