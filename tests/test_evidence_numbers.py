"""Figures inside evidence text (an event's detail, a straggler's or a rank's name, the start-up note
that quotes a detail) are written as the reports write every other figure: with thousands separators.
The alexnet trace's cudaFree row used to read `6,008.692` in the Duration column and "the host was in
cudaFree for 6008.692 ms of it" beside it, and the start-up note "cudaFree for 6,008.7 ms: 4,141x the
typical cudaFree (1451.0 us); the GPU was idle for 6008.692 ms of it"; copies said "16777216 bytes"."""

from __future__ import annotations

import re
from pathlib import Path

from zoomer_ar.analyze import analyze_path
from zoomer_ar.render.report import render_markdown

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ALEXNET = "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
# four or more digits before the point, not preceded by a digit, separator or point: 6008.692, 16777216
UNSEPARATED = re.compile(r"(?<![\d,.])\d{4,}(?:\.\d+)? ?(?:ms|us|bytes)\b")


def _texts(analysis):
    for f in analysis.findings:
        for e in f.evidence.events:
            yield e.name
            yield e.detail
    yield from analysis.notes


def test_large_figures_in_evidence_details_and_notes_have_separators(shared_traces):
    a = analyze_path(shared_traces / ALEXNET)
    texts = list(_texts(a))
    assert any("6,008.692 ms of it" in t for t in texts)  # the cudaFree the GPU idled behind
    assert any("(1,451.0 us)" in t for t in texts)
    assert [t for t in texts if UNSEPARATED.search(t)] == []
    assert not UNSEPARATED.search(render_markdown(a))


def test_copy_sizes_have_separators():
    a = analyze_path(EXAMPLES / "gpu" / "pageable_memcpy")
    details = [e.detail for f in a.findings for e in f.evidence.events if e.detail.endswith(" bytes")]
    assert details and all(re.fullmatch(r"\d{1,3}(?:,\d{3})* bytes", d) for d in details), details


def test_cpu_memory_is_named_host_memory_not_device_minus_one():
    """Kineto writes CPU allocations with Device Id -1; the memory-growth evidence said
    "allocated memory at step ends (device -1)"."""
    a = analyze_path(EXAMPLES / "traces" / "memory_growth")
    (f,) = [f for f in a.findings if f.pattern == "memory-growth"]
    assert [e.name for e in f.evidence.events] == ["allocated memory at step ends (host memory)"]
    g = analyze_path(EXAMPLES / "gpu" / "memory_growth")
    (f,) = [f for f in g.findings if f.pattern == "memory-growth"]
    assert [e.name for e in f.evidence.events] == ["allocated memory at step ends (device 0)"]
