"""Report audit: Markdown that survives hostile names (kernel, file, function, job), numbers written
one way in every report, complete `rules explain` pages, and accelerator traces not called GPU-less.

The Markdown is read back with a real CommonMark/GFM parser (markdown-it-py, installed with rich):
a table row must keep its cells, a code span its text, a paragraph its own lines.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from zoomer_ar.analyze import analyze_path
from zoomer_ar.cli import main
from zoomer_ar.render import render_html, render_markdown, render_text

markdown_it = pytest.importorskip("markdown_it")

REPO = Path(__file__).resolve().parent.parent
GPU_SYNC = REPO / "examples" / "gpu" / "sync_point"
CPU_FP32 = REPO / "examples" / "traces" / "fp32_matmul"

HOSTILE_NAMES = [
    "new\nline\r\tkernel void cutlass::Kernel2<cutlass_80_simt_sgemm>",
    "a|b `c` ``d`` e\\|f void at::native::(anonymous namespace)::vectorized",
    "`leading backtick and trailing`",
    "</code></td><img src=x onerror=alert(2)> void softmax_warp_forward",
    "**bold** [link](http://evil.example/x) {{ 7*7 }} " + "x" * 120,
]
HOSTILE_FILE = "sync|`<b>x</b>`.py"


def _md() -> markdown_it.MarkdownIt:
    return markdown_it.MarkdownIt("commonmark").enable("table")


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every table of the document as (header cells, body rows), each cell as rendered plain text."""
    out = []
    doc = _md().render(text)
    for table in re.findall(r"<table>(.*?)</table>", doc, re.S):
        def cells(row: str, tag: str) -> list[str]:
            return [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", row, re.S)]
        head = re.search(r"<thead>(.*?)</thead>", table, re.S).group(1)
        body = re.search(r"<tbody>(.*?)</tbody>", table, re.S)
        rows = re.findall(r"<tr>(.*?)</tr>", body.group(1), re.S) if body else []
        out.append((cells(head, "th"), [cells(r, "td") for r in rows]))
    return out


def _shown(name: str, limit: int = 80) -> str:
    flat = re.sub(r"\r\n|[\x00-\x1f\x7f\u0085\u2028\u2029]", " ", name)
    return flat if len(flat) <= limit else flat[:limit] + "…"


@pytest.fixture(scope="module")
def gpu_analysis():
    return analyze_path(GPU_SYNC)


@pytest.fixture(scope="module")
def hostile(gpu_analysis):
    a = gpu_analysis.model_copy(deep=True)
    a.job.name = "job <script>|`x`"
    for f in a.findings:
        f.evidence.events = [e.model_copy(update={"name": HOSTILE_NAMES[i % len(HOSTILE_NAMES)]})
                             for i, e in enumerate(f.evidence.events)]
        f.evidence.frames = [fr.model_copy(update={"file": HOSTILE_FILE, "resolved_path": None, "function": "train_*step*"})
                             for fr in f.evidence.frames]
    return a


# --- 1. hostile names in Markdown --------------------------------------------------------------------
def test_markdown_event_tables_keep_rows_columns_and_names(hostile):
    text = render_markdown(hostile)
    events = [e for f in hostile.findings for e in f.evidence.events]
    tables = [(h, rows) for h, rows in _tables(text) if h and h[0] == "Event"]
    assert sum(len(rows) for _, rows in tables) == len(events), "a newline in a name ended a table"
    shown = iter(events)
    for head, rows in tables:
        for row in rows:
            e = next(shown)
            assert len(row) == len(head) == 5
            assert row[0] == _shown(e.name), row  # the whole name, on one line, cut with an ellipsis
            assert row[1] == str(e.rank) and row[2] == f"{e.ts_ms:,.3f}", row  # nothing spilled into the next cells
    # a backslash-escaped backslash before a pipe is a cell separator for cmark-gfm and mistune
    assert not [line for line in text.splitlines() if line.startswith("|") and "\\\\|" in line]


def test_markdown_source_line_and_job_title_are_literal(hostile):
    text = render_markdown(hostile)
    doc = _md().render(text)
    assert "<b>" not in doc and "<script>" not in doc and "<img" not in doc
    source = next(line for line in text.splitlines() if line.startswith("Source: "))
    para = _md().render(source)
    frame = next(f for f in hostile.findings if f.evidence.frames).evidence.frames[0]
    assert html.unescape(re.search(r"<code>(.*?)</code>", para).group(1)) == f"{HOSTILE_FILE}:{frame.resolved_line or frame.line}"
    assert "train_*step*" in html.unescape(re.sub(r"<[^>]+>", "", para))  # no emphasis eaten
    title = _md().render(text.splitlines()[0])
    assert html.unescape(re.sub(r"<[^>]+>", "", title)).strip() == "Zoomer AR report: job <script>|`x`"


def test_markdown_severity_line_is_its_own_paragraph(gpu_analysis):
    doc = _md().render(render_markdown(gpu_analysis))
    paras = re.findall(r"<p>(.*?)</p>", doc, re.S)
    for f in gpu_analysis.findings:
        sev = next(p for p in paras if p.startswith("<strong>Severity</strong> " + f.severity))
        assert "\n" not in sev, f"the severity line of {f.pattern} ran into the explanation"


def test_markdown_tables_all_parse_with_their_columns(hostile):
    text = render_markdown(hostile)
    table_lines = sum(1 for line in text.splitlines() if line.startswith("|"))
    parsed = _tables(text)
    assert table_lines == sum(len(rows) + 2 for _, rows in parsed), "a table line was not read as a table row"
    for head, rows in parsed:
        assert all(len(r) == len(head) for r in rows)


def test_code_span_helper_and_its_jinja_twin_agree():
    from zoomer_ar.render.filters import md_code
    from zoomer_ar.review.render import _env

    macro = _env().from_string('{% import "_markdown.j2" as md %}{{ md.code(v, cell=cell, limit=limit) }}')
    samples = HOSTILE_NAMES + [HOSTILE_FILE, "we|ird`name.py:7", " spaced ", "``", "plain", "x\\", "a\r\nb\u2028c"]
    for v in samples:
        for cell in (True, False):
            for limit in (None, 20):
                assert macro.render(v=v, cell=cell, limit=limit) == md_code(v, cell, limit), (v, cell, limit)
                if not cell:
                    got = _md().render(md_code(v, cell, limit))
                    assert html.unescape(re.search(r"<code>(.*?)</code>", got, re.S).group(1)) == _shown(v, limit or 10**6)


def test_review_comment_keeps_an_odd_file_name_in_its_code_span():
    from zoomer_ar.review.models import FileNote, ReviewFinding, ReviewResult
    from zoomer_ar.review.render import render_markdown as review_md

    path = "we|ird`name.py"
    f = ReviewFinding(rule_id="sync-point", fixer="loop-item-sync", title="T", severity="high", message="m | n",
                      path=path, line=7, column=1, end_line=7, end_column=5, statement_line=7,
                      fingerprint="ab" * 16 + ":1", comment_line=7, fix_diff="@@ -7 +7 @@\n-a\n+b\n")
    r = ReviewResult(repo="/r", base="main", base_sha="a" * 40, head="f", head_sha="b" * 40, merge_base_sha="a" * 40,
                     files_changed=1, findings=[f], errors=[FileNote(path=path, message="bad", line=3)],
                     skipped=[FileNote(path=path, message="binary")])
    text = review_md(r)
    [(head, rows)] = _tables(text)
    assert rows[0][3] == f"{path}:7" and rows[0][4] == "m | n" and len(rows[0]) == len(head)
    codes = [html.unescape(c) for c in re.findall(r"<code>(.*?)</code>", _md().render(text), re.S)]
    assert f"{path}:7" in codes and f"{path}:3" in codes and path in codes, codes


# --- 2. numbers ---------------------------------------------------------------------------------------
def test_numbers_have_one_style(gpu_analysis):
    a = gpu_analysis.model_copy(deep=True)
    a.features["profiler_steps"] = 1
    a.features["step_ms"] = 13336.32
    a.bottleneck.summary = "host-bound: 96% of the accounted GPU time (13250.65 ms per profiled step)"
    a.findings[-1].impact.gpu_hours_per_1000_steps = 0.000122
    text, md, page = render_text(a), render_markdown(a), render_html(a)
    assert "1 profiled step\n" in text.splitlines()[0] + "\n" and "1 profiled steps" not in text
    assert "13,250.65 ms per profiled step" in text and "13250.65" not in md + text + page
    assert "(1 profiled step)" in page and "(1 steps)" not in page
    row = next(line for line in md.splitlines() if line.startswith(f"| {len(a.findings)} |"))
    assert "| 0.000122 |" in row, row
    assert "0.000122 GPU-hours per 1,000 steps" in page


def test_cost_tables_use_the_shared_number_filters(gpu_analysis):
    from zoomer_ar.store.cost import cost_attribution

    a = gpu_analysis.model_copy(deep=True)
    a.features["cost_attribution"] = cost_attribution(a.features, a.findings, gpus=1, gpu_hour_cost=2.5)
    md = render_markdown(a)
    cost = md[md.index("## Cost attribution"):]
    assert "e-0" not in cost and "e-1" not in cost, "GPU-hours without exponents"
    assert "$2.50/GPU-hour" in cost


def test_cpu_only_trace_names_its_hardware():
    a = analyze_path(CPU_FP32)
    md = render_markdown(a)
    hw = next(line for line in md.splitlines() if line.startswith("| Hardware"))
    assert "CPU-only" in hw and "| none |" not in hw
    row = next(line for line in md.splitlines() if line.startswith("| 1 | `fp32-matmul`"))
    assert "| 0.0000 |" not in row, row


# --- 3. rules explain ---------------------------------------------------------------------------------
def test_explain_pages_spell_out_settings_and_terms(capsys):
    assert main(["rules", "explain", "launch-bound"]) == 0
    page = capsys.readouterr().out
    assert "{'" not in page and "'compile': True" not in page
    assert "`compile=true`" in page and "`compile_mode=reduce-overhead`" in page
    assert "- `impact_pct`:" in page and "min_severity" in page and "critical from 25%" in page
    assert main(["rules", "explain", "sync-point"]) == 0
    page = capsys.readouterr().out
    assert "`True`" not in page and "applies to: every trace" in page
    assert "otherwise info" in page
    assert main(["rules", "explain", "memory-growth"]) == 0
    assert "always high (`fixed_severity`" in capsys.readouterr().out


@pytest.mark.parametrize("block, words", [("on_cpu", "On CPU-only traces"),
                                          ("on_rocm", "On AMD GPUs (ROCm, HIP runtime)")])
def test_explain_shows_a_rules_hardware_wording(capsys, block, words):
    """`rules explain sync-point` gave only the GPU text: the title, explanation and advice a CPU-only
    trace's finding carries (on_cpu) were nowhere on the page; nor is an AMD trace's (on_rocm)."""
    from zoomer_ar.detect.rules import load_rules

    worded = [r for r in load_rules() if getattr(r, block).model_dump(exclude_none=True)]
    assert worded
    for r in worded:
        assert main(["rules", "explain", r.id]) == 0
        page = capsys.readouterr().out
        own = getattr(r, block)
        if own.title:
            assert f"\n\n{words} the finding is titled: {own.title.strip()}\n\n" in page, r.id
        for field, section in (("explanation", "## Why it costs time"), ("recommendation", "## How to fix it"),
                               ("unless", "## How to fix it")):
            text = getattr(own, field)
            if text:  # its own paragraph, in the section its GPU text is in
                at = page.find(f"\n\n{words}:\n{text.strip()}\n\n")
                assert at > 0, (r.id, field)
                assert page.rfind("\n## ", 0, at) == page.index("\n" + section), (r.id, field)


def test_explain_says_what_a_finding_adds_where_its_fix_does_not_apply(capsys):
    assert main(["rules", "explain", "fp32-matmul"]) == 0
    page = capsys.readouterr().out
    assert "Where `tf32_capable or not has_gpu` does not hold, no fix is offered and the finding adds:\nThese GPUs" in page


def test_explain_suggests_the_closest_rule(capsys):
    assert main(["rules", "explain", "sync_point"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean sync-point?" in err[0], err
    assert main(["rules", "explain", "no-such-rule-at-all"]) == 2
    assert "did you mean" not in capsys.readouterr().err


# --- 4. accelerator traces ------------------------------------------------------------------------------
def test_accelerator_trace_is_not_called_gpu_less(gpu_analysis):
    a = gpu_analysis.model_copy(deep=True)
    a.features.update(has_gpu=False, has_accelerator=True, accelerator="mtia", gpu_busy_pct=None)
    a.job.ranks[0].devices = []
    a.job.ranks[0].accelerator = "mtia"
    a.bottleneck.summary = "compute-bound: 99% of the host time (no GPU in this trace) (13250.65 ms per profiled step)"
    for out in (render_markdown(a), render_text(a), render_html(a)):
        assert "no GPU in this trace" not in out
        assert "no CUDA/ROCm GPU events; accelerator trace" in out
    hw = next(line for line in render_markdown(a).splitlines() if line.startswith("| Hardware"))
    assert "MTIA" in hw


def test_a_tiny_step_is_not_rounded_away(shared_traces):
    """kineto/sync_event_order/before_fix_trace.json spans 0.00013 ms: `compare` said "step time
    0.00013 ms" while report.md, report.html and the summary said "Step time 0.00 ms"."""
    from zoomer_ar.compare import _ms
    from zoomer_ar.render.filters import fmt_ms

    a = analyze_path(shared_traces / "kineto/sync_event_order/before_fix_trace.json")
    step = a.features["step_ms"]
    assert 0 < step < 0.001
    shown = fmt_ms(step)
    assert shown == _ms(step) == "0.00013 ms"
    assert f"| Step time | {shown} |" in render_markdown(a)
    assert f"step {shown} |" in render_text(a)
    assert shown in render_html(a)
    assert fmt_ms(0.0) == "0.00 ms" and fmt_ms(0.01) == "0.01 ms" and fmt_ms(1234.567) == "1,234.57 ms"


@pytest.mark.parametrize("trace, span", [("hta/triton_example", "0.00176 ms"),
                                         ("tracelens/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz",
                                          "159.99 ms")])
def test_gpu_busy_of_a_narrow_span_says_what_it_is_a_share_of(shared_traces, trace, span):
    """GPU busy is a share of the GPU's span (first to last device op): one 1.8 us Triton kernel in a 13 s
    trace read "GPU busy 100.0%" in every report, beside a host-bound bottleneck of 100%."""
    a = analyze_path(shared_traces / trace)
    wall = f"{a.features['wall_ms']:,.2f} ms"
    assert f"GPU busy {a.features['gpu_busy_pct']:.1f}% of a {span} span (first to last GPU op; trace {wall})" \
        in render_text(a)
    assert f"of a {span} span (first to last GPU op; the trace covers {wall})" in render_markdown(a)
    assert f"GPU busy (of a {span} span: first to last GPU op; trace {wall})" in html.unescape(render_html(a))


def test_gpu_busy_of_most_of_the_trace_is_not_qualified(gpu_analysis):
    assert gpu_analysis.features["gpu_span_ms"] >= 0.5 * gpu_analysis.features["wall_ms"]
    assert " span " not in render_text(gpu_analysis).splitlines()[2]
    assert "first to last GPU op" not in render_markdown(gpu_analysis)


def test_a_cpu_only_trace_has_no_gpu_hours_to_attribute():
    """A CPU-only trace's reports had a GPU-h column of zeros and '0 GPU-hours (profiled wall time 590.9 ms x 0
    GPUs)' over a phase table of zero GPU-hours and '-' costs."""
    a = analyze_path(REPO / "examples/traces/dataloader_bound")
    assert not a.features["has_accelerator"] and a.findings
    from zoomer_ar.store.cost import cost_attribution

    a.features["cost_attribution"] = cost_attribution(a.features, a.findings)
    md, page = render_markdown(a), html.unescape(render_html(a))
    assert "x 0 GPUs" not in md and "x 0 GPUs" not in page
    assert "No GPU or accelerator in this trace: no GPU-hours to attribute" in md
    assert "No GPU or accelerator in this trace: no GPU-hours to attribute" in page
    row = next(line for line in md.splitlines() if line.startswith("| 1 | `dataloader-bound`"))
    assert row.split("|")[6].strip() == "-"
    assert "GPU-hours per 1,000 steps" not in page
    phase_row = next(line for line in md.splitlines() if line.startswith("| dataloader |"))
    assert phase_row.count("|") == 3  # phase and share only
    # GPU-hours given for the job are attributed as before
    a.features["cost_attribution"] = cost_attribution(a.features, a.findings, gpu_hours=10.0)
    md = render_markdown(a)
    assert "10.0 GPU-hours (given with --gpu-hours)" in md and "| Phase | Share | GPU-hours | Cost |" in md


def test_markdown_and_summary_give_the_combined_avoidable_time(gpu_analysis):
    """Only report.html showed the combined avoidable time (findings within another counted once); report.md
    and the terminal summary left the reader to add up overlapping impacts (idle-gpu 94.5% + launch-bound 89.8%)."""
    from zoomer_ar.detect.combine import combined_impact, within_present

    assert len(gpu_analysis.findings) > 1 and within_present(gpu_analysis.findings)
    c = combined_impact(gpu_analysis.findings)
    assert c.pct_of_step < sum(x.impact.pct_of_step for x in gpu_analysis.findings)
    ms, pct = f"{c.ms_per_step:,.2f} ms", f"{c.pct_of_step:.1f}%"
    assert f"Avoidable per step, combined: {ms} ({pct} of the step), an upper bound" in render_markdown(gpu_analysis)
    assert f"avoidable per step, combined: {ms} ({pct} of step; an upper bound)" in render_text(gpu_analysis)
    one = gpu_analysis.model_copy(update={"findings": gpu_analysis.findings[:1]})
    assert "combined" not in render_markdown(one) and "combined" not in render_text(one)


MTIA = "hta/mtia_trace_single_rank/mtia_rank_0.json.gz"


def test_an_accelerator_trace_counts_accelerator_hours_not_gpu_hours(shared_traces, tmp_path):
    """On the MTIA trace every cost line said 'GPU-hours (profiled wall time 13,340.0 ms x 1 GPU)' and
    '/GPU-hour', of a job that ran on no GPU; findings.json keeps its gpu_hours keys and says the unit."""
    import json

    out = tmp_path / "mtia"
    assert main(["analyze", str(shared_traces / MTIA), "--out", str(out), "--gpu-hour-cost", "2", "--no-progress"]) == 0
    md, page = (out / "report.md").read_text(), html.unescape((out / "report.html").read_text())
    cost = json.loads((out / "findings.json").read_text())["features"]["cost_attribution"]
    assert cost["gpus"] == 1 and cost["gpu_hours"] > 0  # the keys are kept
    assert cost["hours_unit"] == "accelerator-hours" and cost["gpu_hours_basis"].endswith("x 1 accelerator")
    for text in (md, page):
        assert "GPU-h" not in text and "x 1 GPU" not in text and "/GPU-hour" not in text
        assert "accelerator-hours (profiled wall time" in text and "x 1 accelerator)" in text
        assert "/accelerator-hour" in text and "Accelerator-hours" in text
    # a finding's own figure (per 1,000 steps) in the findings table and the HTML card
    a = analyze_path(shared_traces / MTIA)
    a.findings = [f.model_copy(deep=True) for f in analyze_path(GPU_SYNC).findings[:1]]
    md, page = render_markdown(a), html.unescape(render_html(a))
    assert "| Accelerator-h / 1k steps |" in md and "GPU-h" not in md
    assert "accelerator-hours per 1,000 steps" in page and "GPU-hours" not in page


def test_a_gpu_trace_still_counts_gpu_hours(gpu_analysis):
    from zoomer_ar.store.cost import cost_attribution

    a = gpu_analysis.model_copy(deep=True)
    a.features["cost_attribution"] = cost = cost_attribution(a.features, a.findings, gpu_hour_cost=2.0)
    assert cost["hours_unit"] == "GPU-hours" and cost["gpu_hours_basis"].endswith("x 1 GPU")
    md = render_markdown(a)
    assert "| GPU-h / 1k steps |" in md and "GPU-hours (profiled wall time" in md and "/GPU-hour" in md
    assert "accelerator" not in md.lower().replace("accelerator trace", "")


# --- 5. a CPU-only trace's findings in its own hardware's words ------------------------------------------
GPU_WORDS = re.compile(r"GPU|tensor[- ]core|CUDA|cuda|DtoD|pin_memory=True")
CPU_TRACES = sorted(p for p in (REPO / "examples" / "traces").iterdir() if (p / "job.json").is_file())


@pytest.fixture(scope="module")
def cpu_findings():
    out = []
    for trace in CPU_TRACES:
        a = analyze_path(trace)
        assert not a.features["has_accelerator"] and not a.features["device_not_recorded"]
        out += [(trace.name, a, f) for f in a.findings]
    return out


def test_a_cpu_only_trace_is_not_told_about_the_gpu(cpu_findings):
    """On the CPU example traces sync-point's title read 'Host synchronisations drain the GPU queue every
    step' and misaligned-gemm's 'not tensor-core aligned'; fp32-matmul advised torch.autocast("cuda"),
    dataloader-bound pin_memory=True and moving augmentation to the GPU, extra-copy 'the DtoD memcpys',
    memory-growth torch.cuda.memory._record_memory_history()."""
    patterns = {f.pattern for _, _, f in cpu_findings}
    assert {"sync-point", "misaligned-gemm", "fp32-matmul", "dataloader-bound", "extra-copy",
            "memory-growth"} <= patterns
    for name, _, f in cpu_findings:
        assert not GPU_WORDS.search(f.title), (name, f.pattern, f.title)
        # the advice: what to do on this machine (a closing "On a GPU ..." aside may name the GPU's way)
        advice = f.recommendation.split("(On a GPU")[0]
        assert not re.search(r"torch\.cuda|autocast\(\"cuda\"|pin_memory=True|DtoD|to the GPU", advice), \
            (name, f.pattern, advice)
    sync = next((a, f) for _, a, f in cpu_findings if f.pattern == "sync-point")
    for out in (render_text(sync[0]), render_markdown(sync[0]), render_html(sync[0])):
        assert "drain the GPU queue" not in out and "Tensor values are read on the host every step" in out


def test_a_cpu_only_trace_is_not_told_about_kernels(cpu_findings, shared_traces):
    """single-tensor-optimizer on the CPU traces (examples/traces/single_tensor_optimizer, hta/cpu_only_full)
    explained that 'the for-loop launches thousands of tiny kernels per step' and that fused is 'one
    kernel', and advised fused=True 'on CUDA' only: a CPU job has no kernels to launch."""
    cpu_full = analyze_path(shared_traces / "hta/cpu_only_full")
    found = [f for _, _, f in cpu_findings if f.pattern == "single-tensor-optimizer"]
    found += [f for f in cpu_full.findings if f.pattern == "single-tensor-optimizer"]
    assert len(found) >= 2
    for f in found:
        for text in (f.explanation, f.recommendation.split("(On a GPU")[0]):
            assert not re.search(r"kernel|launch|CUDA|GPU", text), text
        assert "fused=True" in f.recommendation and "foreach=True" in f.recommendation


def test_a_gpu_trace_keeps_the_gpu_wording(gpu_analysis, shared_traces):
    """The CPU wording is for CPU-only traces: a GPU trace, and a GPU job profiled without its device
    activity (device_not_recorded: the trace lists an A100), keep the GPU titles."""
    sync = next(f for f in gpu_analysis.findings if f.pattern == "sync-point")
    assert sync.title == "Host synchronisations drain the GPU queue every step"
    a = analyze_path(shared_traces / "hta/distributed_info_unavailable/distributed_info_not_found.json.gz")
    assert a.features["device_not_recorded"]
    sync = next(f for f in a.findings if f.pattern == "sync-point")
    assert "GPU" in sync.title and "torch.cuda.synchronize()" in sync.recommendation


def test_a_gpu_job_profiled_without_its_device_is_not_called_gpu_less(shared_traces, tmp_path):
    """distributed_info_not_found.json.gz lists an A100 (Hardware row, the note: 'Host op times of a GPU job
    are dispatch times') but no kernels: its cost section said 'No GPU or accelerator in this trace'."""
    out = tmp_path / "dnr"
    trace = shared_traces / "hta/distributed_info_unavailable/distributed_info_not_found.json.gz"
    assert main(["analyze", str(trace), "--out", str(out), "--no-progress"]) == 0
    md, page = (out / "report.md").read_text(), html.unescape((out / "report.html").read_text())
    for text in (md, page):
        assert "No GPU or accelerator in this trace" not in text
        assert "The trace lists NVIDIA A100-PG509-200 but records none of its activity: no GPU-hours counted" in text


# --- 6. an AMD (ROCm) trace's findings in HIP's words ----------------------------------------------------
CUDA_ONLY_NAMES = re.compile(r"\bcuda[A-Z]\w*|CUDA[ -]graph|Ampere|tensor[- ]core")
ROCM_NORMALIZATION = "tracelens/perf_model/normalization/normalization_layer_test.json.gz"  # MI300X


def _rocm_text(f) -> str:
    return "\n".join((f.title, f.explanation, f.recommendation))


def test_an_amd_trace_is_told_the_hip_names(shared_traces):
    """hta/amd_trace (MI250, ROCm 6.2) and the MI300X normalization trace were told about 'a
    cudaMalloc/cudaFree', 'a stream capture into a CUDA graph' and 'capture static parts with CUDA graphs'
    (idle-gpu, launch-bound): their runtime is HIP (hipMalloc, HIP graphs through torch.cuda.graphs)."""
    seen = set()
    for trace in ("hta/amd_trace", ROCM_NORMALIZATION):
        a = analyze_path(shared_traces / trace)
        assert a.features["accelerator"] == "amd" and a.features["has_gpu"]
        for f in a.findings:
            seen.add(f.pattern)
            assert not CUDA_ONLY_NAMES.search(_rocm_text(f)), (trace, f.pattern, CUDA_ONLY_NAMES.search(_rocm_text(f)))
        idle = next(f for f in a.findings if f.pattern == "idle-gpu")
        assert "hipMalloc/hipFree" in idle.explanation and "HIP graph" in idle.explanation
        assert "HIP graphs through\n`torch.cuda.graphs`" in idle.recommendation
    assert {"idle-gpu", "launch-bound"} <= seen
    launch = next(f for f in a.findings if f.pattern == "launch-bound")
    assert "uses HIP graphs on ROCm" in launch.recommendation and "torch.compile(model)" in launch.recommendation


def test_amd_wording_of_rules_no_amd_trace_here_shows(shared_traces):
    """fp32-matmul ('On Ampere+', and where the fix is not offered 'it came with Ampere ... bf16 needs
    Ampere') and allocator-churn ('call cudaMalloc or cudaFree') on the MI300X trace's own features: the
    corpus's AMD traces show neither pattern, so the rules' findings are built on those features."""
    from zoomer_ar.detect.engine import finding_from_rule
    from zoomer_ar.detect.rules import get_rule
    from zoomer_ar.features import extract
    from zoomer_ar.load import load_job

    jf = extract(load_job(shared_traces / ROCM_NORMALIZATION))
    features = jf.vector.model_dump()
    assert features["accelerator"] == "amd" and not features["tf32_capable"]
    result = {"impact_ms": 1.0, "impact_pct": 10.0, "confidence": 0.8}
    fp32 = finding_from_rule(get_rule("fp32-matmul"), result, jf, features)
    assert not fp32.fixers  # fix.when does not hold: the ROCm `unless` is appended
    assert not CUDA_ONLY_NAMES.search(_rocm_text(fp32)), _rocm_text(fp32)
    assert "TF32/XF32 (Instinct MI300 and newer)" in fp32.recommendation
    assert "No automatic patch is offered on AMD GPUs" in fp32.recommendation
    churn = finding_from_rule(get_rule("allocator-churn"), result, jf, features)
    assert "call hipMalloc or hipFree" in churn.explanation and not CUDA_ONLY_NAMES.search(_rocm_text(churn))
    assert churn.relaunch == {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}  # settings unchanged


def test_a_cuda_trace_keeps_the_cuda_names(shared_traces):
    a = analyze_path(shared_traces / "hta/nccl_parser_config/nccl_data.json.gz")  # A100
    assert a.features["accelerator"] == "nvidia"
    idle = next(f for f in a.findings if f.pattern == "idle-gpu")
    assert "cudaMalloc/cudaFree" in idle.explanation and "CUDA graph" in idle.explanation
    from zoomer_ar.detect.rules import get_rule

    rule = get_rule("fp32-matmul")
    assert rule.text_for(a.features).recommendation.startswith("On Ampere+")


def test_every_rocm_wording_names_no_cuda_api():
    from zoomer_ar.detect.rules import load_rules

    worded = [r for r in load_rules() if r.on_rocm.model_dump(exclude_none=True)]
    assert {"fp32-matmul", "idle-gpu", "launch-bound", "allocator-churn"} <= {r.id for r in worded}
    for r in worded:
        for field, text in r.on_rocm.model_dump(exclude_none=True).items():
            assert not CUDA_ONLY_NAMES.search(text), (r.id, field, CUDA_ONLY_NAMES.search(text))
