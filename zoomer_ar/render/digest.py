"""Rendering the weekly digest (reports/digest.md.j2, reports/digest.html.j2) and a job's history.

The HTML is email-ready: every style is inline on its element, no <style> or <script>; the chart of
waste over time is inline SVG. The Markdown carries the same tables and a text sparkline.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from ..features.names import ACCELERATOR_NOUN, BOTH_NOUNS
from ..paths import REPORTS_DIR
from .filters import fmt_change, fmt_gh, fmt_usd, install, md_code_text, md_text, one_line

__all__ = ["chart", "fmt_change", "fmt_gh", "fmt_usd", "md_code_text", "md_text", "render_digest", "render_history"]

if TYPE_CHECKING:
    from ..store.digest import Digest
    from ..store.history import History


@lru_cache(maxsize=1)
def _env() -> Environment:
    """One environment per process (it keeps the compiled templates), as render.report's."""
    env = Environment(
        loader=FileSystemLoader(str(REPORTS_DIR)),
        autoescape=lambda name: bool(name) and name.endswith(".html.j2"),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    return install(env)


def chart(d: Digest, width: int = 560, height: int = 140) -> dict[str, Any]:
    """Bar geometry for the waste-over-time SVG (one bar per week, wasted GPU-hours: accelerator-hours of MTIA)."""
    pts = d.series
    top = max((p.wasted_gpu_hours for p in pts), default=0.0)
    n = max(len(pts), 1)
    pad_l, pad_b, pad_t = 4, 22, 16
    slot = (width - pad_l * 2) / n
    plot_h = height - pad_b - pad_t
    bars = []
    for i, p in enumerate(pts):
        h = 0.0 if top <= 0 else plot_h * p.wasted_gpu_hours / top
        bars.append({
            "x": round(pad_l + i * slot + slot * 0.15, 1), "w": round(slot * 0.7, 1),
            "y": round(pad_t + plot_h - h, 1), "h": round(h, 1), "week": p.week,
            "label": f"{p.week}: {fmt_gh(p.wasted_gpu_hours)} {d.device}-h wasted ({fmt_usd(p.wasted_usd)})",
            "short": p.week[-3:], "tx": round(pad_l + i * slot + slot / 2, 1), "current": p.week == d.week,
        })
    return {"width": width, "height": height, "bars": bars, "top": top, "base_y": height - pad_b, "label_y": height - 6}


def render_digest(d: Digest, fmt: str = "md", *, top: int = 10) -> str:
    if fmt == "json":
        return json.dumps(d.model_dump(mode="json"), indent=2) + "\n"
    name = {"md": "digest.md.j2", "html": "digest.html.j2"}[fmt]
    share = 100.0 * d.wasted_gpu_hours / d.gpu_hours if d.gpu_hours > 0 else None
    return _env().get_template(name).render(d=d, top=top, chart=chart(d), waste_share=share,
                                            units_note=units_note(d.device))


def units_note(device: str) -> str:
    """What a digest's or history's hours are when they are not (only) GPU-hours (store/devices.py)."""
    if device == ACCELERATOR_NOUN:
        return "Accelerator-hours: hours of accelerators that are not GPUs (MTIA), as the analyze reports count them."
    if device == BOTH_NOUNS:
        return ("GPU/accelerator-hours: the GPU-hours of GPU runs and the accelerator-hours of runs on accelerators "
                "that are not GPUs (MTIA), added up; each job's rows name its own.")
    return ""


def render_history(h: History, fmt: str = "text") -> str:
    if fmt == "json":
        return json.dumps(h.model_dump(mode="json"), indent=2) + "\n"
    md = fmt == "md"
    lines: list[str] = []
    esc = md_text if md else one_line
    dev = h.device
    head = (f"{esc(h.job)}: team {esc(h.team) or '-'}, owner {esc(h.owner) or '-'}, {h.gpu_count or 0} x "
            f"{esc(h.gpu_type) or dev}")
    if h.gpu_hour_cost is not None:
        head += f", ${h.gpu_hour_cost:,.2f}/{dev}-hour"
    lines.append(f"# History: {head}" if md else head)
    lines.append("")
    if not h.runs:
        lines.append("No recorded runs.")
        return "\n".join(lines) + "\n"
    if md:
        lines += [f"| Week | Recorded | Trace | {dev[:1].upper()}{dev[1:]}-h | Cost | Step | Findings (pct of step, "
                  f"wasted {dev}-h) |",
                  "|---|---|---|---|---|---|---|"]
    for r in h.runs:
        fs = ", ".join(f"{esc(f.pattern)} {f.pct_of_step:.1f}% ({fmt_gh(f.wasted_gpu_hours)}"
                       f"{'' if r.device == dev else ' ' + r.device + '-h'})" for f in r.findings) or "none"
        if md:
            own = "" if r.device == dev else f" {r.device}-h"  # a job with runs of both: each run says its own
            lines.append(f"| {r.week} | {r.recorded_at:%Y-%m-%d %H:%M} | `{r.trace_hash[:12]}` | {fmt_gh(r.gpu_hours)}{own} | "
                         f"{fmt_usd(r.usd)} | {r.step_ms:,.1f} ms | {fs} |")
        else:
            lines.append(f"{r.week}  {r.recorded_at:%Y-%m-%d %H:%M}  {r.trace_hash[:12]}  {fmt_gh(r.gpu_hours):>8} {r.device}-h  "
                         f"{fmt_usd(r.usd):>9}  step {r.step_ms:,.1f} ms")
            for f in r.findings:
                lines.append(f"    {f.pattern:<26} {f.pct_of_step:5.1f}% of step  {fmt_gh(f.wasted_gpu_hours):>8} {r.device}-h  "
                             f"{fmt_usd(f.wasted_usd):>9}  [{f.severity}]")
            if not r.findings:
                lines.append("    no findings")
    if h.patterns:
        lines.append("")
        lines.append(f"## Wasted {dev}-hours by pattern and week" if md else f"Wasted {dev}-hours by pattern and week:")
        lines.append("")
        if md:
            lines.append("| Pattern | " + " | ".join(h.weeks) + " |")
            lines.append("|---|" + "---|" * len(h.weeks))
            for p in h.patterns:
                lines.append(f"| `{md_code_text(p)}` | " + " | ".join(fmt_gh(h.matrix[p][w]) if w in h.matrix[p] else "·"
                                                       for w in h.weeks) + " |")
        else:
            lines.append(f"{'pattern':<26} " + " ".join(f"{w:>9}" for w in h.weeks))
            for p in h.patterns:
                lines.append(f"{p:<26} " + " ".join(f"{fmt_gh(h.matrix[p][w]) if w in h.matrix[p] else '·':>9}"
                                                  for w in h.weeks))
    return "\n".join(lines) + "\n"
