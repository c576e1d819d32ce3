"""Rendering the weekly digest (reports/digest.md.j2, reports/digest.html.j2) and a job's history.

The HTML is email-ready: every style is inline on its element, no <style> or <script>; the chart of
waste over time is inline SVG. The Markdown carries the same tables and a text sparkline.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from ..paths import REPORTS_DIR

if TYPE_CHECKING:
    from ..store.digest import Digest
    from ..store.history import History


def fmt_gh(v: float | None) -> str:
    """GPU-hours: tiny profiled windows and fleet-scale weeks both readable."""
    if v is None:
        return "-"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:,.1f}"
    if a >= 0.1:
        return f"{v:.2f}"
    return format(Decimal(f"{v:.3g}"), "f")  # 0.0000443, not 4.43e-05: three digits, no exponent


def fmt_usd(v: float | None) -> str:
    if v is None:
        return "-"
    a = abs(v)
    if a == 0:
        return "$0"
    if a >= 100:
        return f"${v:,.0f}"
    if a >= 0.01:
        return f"${v:,.2f}"
    return "<$0.01"


def fmt_change(v: float | None) -> str:
    if v is None:
        return "new"
    if abs(v) < 0.5:
        return "→ 0%"
    return f"{'↑' if v > 0 else '↓'} {abs(v):.0f}%"


_MD_SPECIAL = re.compile(r"[\\`*\[\]|]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]+")


def md_text(value: object) -> str:
    """User text (job, team and owner names) for Markdown: literal, never markup.

    `& < >` become entities (no raw HTML such as `<script>` or `<img onerror>` reaches the page),
    Markdown punctuation (backslash, backtick, `*`, `[`, `]`, `|`, and `_` where it could start or
    end emphasis) is backslash-escaped, and line breaks and control characters become one space.
    """
    if value is None:
        return ""
    text = _CONTROL.sub(" ", str(value))
    text = _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), text)
    return "".join(_MD_ENTITIES.get(ch, ch) for ch in text)


def md_code(value: object) -> str:
    """Text inside a Markdown code span (pattern ids): no backtick can close the span, no `|` split a table cell."""
    if value is None:
        return ""
    return _CONTROL.sub(" ", str(value)).replace("`", "'").replace("|", "\\|")


def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(REPORTS_DIR)),
        autoescape=lambda name: bool(name) and name.endswith(".html.j2"),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["gh"] = fmt_gh
    env.filters["usd"] = fmt_usd
    env.filters["change"] = fmt_change
    env.filters["pct"] = lambda v: "-" if v is None else f"{v:.1f}%"
    env.filters["md"] = md_text
    env.filters["code"] = md_code
    return env


def chart(d: Digest, width: int = 560, height: int = 140) -> dict[str, Any]:
    """Bar geometry for the waste-over-time SVG (one bar per week, wasted GPU-hours)."""
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
            "label": f"{p.week}: {fmt_gh(p.wasted_gpu_hours)} GPU-h wasted ({fmt_usd(p.wasted_usd)})",
            "short": p.week[-3:], "tx": round(pad_l + i * slot + slot / 2, 1), "current": p.week == d.week,
        })
    return {"width": width, "height": height, "bars": bars, "top": top, "base_y": height - pad_b, "label_y": height - 6}


def render_digest(d: Digest, fmt: str = "md", *, top: int = 10) -> str:
    if fmt == "json":
        return json.dumps(d.model_dump(mode="json"), indent=2) + "\n"
    name = {"md": "digest.md.j2", "html": "digest.html.j2"}[fmt]
    share = 100.0 * d.wasted_gpu_hours / d.gpu_hours if d.gpu_hours > 0 else None
    return _env().get_template(name).render(d=d, top=top, chart=chart(d), waste_share=share)


def render_history(h: History, fmt: str = "text") -> str:
    if fmt == "json":
        return json.dumps(h.model_dump(mode="json"), indent=2) + "\n"
    md = fmt == "md"
    lines: list[str] = []
    esc = md_text if md else (lambda v: "" if v is None else _CONTROL.sub(" ", str(v)))
    head = (f"{esc(h.job)}: team {esc(h.team) or '-'}, owner {esc(h.owner) or '-'}, {h.gpu_count or 0} x "
            f"{esc(h.gpu_type) or 'GPU'}")
    if h.gpu_hour_cost is not None:
        head += f", ${h.gpu_hour_cost:,.2f}/GPU-hour"
    lines.append(f"# History: {head}" if md else head)
    lines.append("")
    if not h.runs:
        lines.append("No recorded runs.")
        return "\n".join(lines) + "\n"
    if md:
        lines += ["| Week | Recorded | Trace | GPU-h | Cost | Step | Findings (pct of step, wasted GPU-h) |",
                  "|---|---|---|---|---|---|---|"]
    for r in h.runs:
        fs = ", ".join(f"{esc(f.pattern)} {f.pct_of_step:.1f}% ({fmt_gh(f.wasted_gpu_hours)})" for f in r.findings) or "none"
        if md:
            lines.append(f"| {r.week} | {r.recorded_at:%Y-%m-%d %H:%M} | `{r.trace_hash[:12]}` | {fmt_gh(r.gpu_hours)} | "
                         f"{fmt_usd(r.usd)} | {r.step_ms:,.1f} ms | {fs} |")
        else:
            lines.append(f"{r.week}  {r.recorded_at:%Y-%m-%d %H:%M}  {r.trace_hash[:12]}  {fmt_gh(r.gpu_hours):>8} GPU-h  "
                         f"{fmt_usd(r.usd):>9}  step {r.step_ms:,.1f} ms")
            for f in r.findings:
                lines.append(f"    {f.pattern:<26} {f.pct_of_step:5.1f}% of step  {fmt_gh(f.wasted_gpu_hours):>8} GPU-h  "
                             f"{fmt_usd(f.wasted_usd):>9}  [{f.severity}]")
            if not r.findings:
                lines.append("    no findings")
    if h.patterns:
        lines.append("")
        lines.append("## Wasted GPU-hours by pattern and week" if md else "Wasted GPU-hours by pattern and week:")
        lines.append("")
        if md:
            lines.append("| Pattern | " + " | ".join(h.weeks) + " |")
            lines.append("|---|" + "---|" * len(h.weeks))
            for p in h.patterns:
                lines.append(f"| `{md_code(p)}` | " + " | ".join(fmt_gh(h.matrix[p][w]) if w in h.matrix[p] else "·"
                                                       for w in h.weeks) + " |")
        else:
            lines.append(f"{'pattern':<26} " + " ".join(f"{w:>9}" for w in h.weeks))
            for p in h.patterns:
                lines.append(f"{p:<26} " + " ".join(f"{fmt_gh(h.matrix[p][w]) if w in h.matrix[p] else '·':>9}"
                                                  for w in h.weeks))
    return "\n".join(lines) + "\n"
