"""The filters every report template shares: Markdown escaping, truncation and number formatting.

One helper per job, so that no template escapes a table cell or rounds a number its own way:

* ``code``: a Markdown code span (CommonMark: the fence is one backtick longer than the longest
  backtick run inside, padded with a space where the text starts or ends with a backtick or a
  space); in a table cell (the default) pipes are escaped once, and line breaks and control
  characters become spaces so that a row never splits;
* ``md``: plain user text (job, file, function names) as literal Markdown text;
* ``clip``: at most N characters, then an ellipsis;
* ``ms``, ``fixed``, ``num``, ``gh``, ``usd``, ``pct``, ``plural``: numbers with thousands
  separators throughout, significant digits (never an exponent, never a rounded-away 0.0000) for
  small values, and singular or plural nouns.

reports/_markdown.j2 holds the Jinja twin of ``code`` for templates rendered by environments
outside this package (the review comment); tests/test_report_audit.py checks the two agree.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from jinja2 import Environment

ELLIPSIS = "…"

# one space per line break (CRLF counts as one) or control character: a table row stays one line
_CONTROL = re.compile(r"\r\n|[\x00-\x1f\x7f\u0085\u2028\u2029]")
_BACKTICK_RUN = re.compile(r"`+")
_MD_SPECIAL = re.compile(r"[\\`*\[\]|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# inside <code>, Markdown still parses: these would be escapes, code spans, emphasis, links, strike-
# through, raw HTML or entities, and the pipe a cell separator
_HTML_CODE_ENTITIES = {c: f"&#{ord(c)};" for c in "\\|`*_[]~!&<>"}
_BIG_MS = re.compile(r"(?<![\d.,])\d{4,}(?:\.\d+)?(?= ?ms\b)")


# --- text --------------------------------------------------------------------------------------------
def one_line(value: object) -> str:
    """The text on one line: each line break or control character becomes one space."""
    return "" if value is None else _CONTROL.sub(" ", str(value))


def clip(value: object, limit: int | None) -> str:
    """The first ``limit`` characters, followed by an ellipsis when anything was cut."""
    text = "" if value is None else str(value)
    if limit is None or len(text) <= limit:
        return text
    return text[:limit] + ELLIPSIS


def md_code(value: object, cell: bool = True, limit: int | None = None) -> str:
    """``value`` as one Markdown code span, including its fences ("" for empty text).

    ``cell``: the span sits in a GFM table cell, so each ``|`` is written ``\\|`` (the table
    parser removes the backslash before the span is read). A backslash right before a pipe has no
    code-span spelling that every GFM parser reads the same way (``\\\\|`` is one cell for
    markdown-it, an escaped backslash and a cell separator for mistune and parsers that pair
    backslashes), so such text is written as ``<code>`` with the characters Markdown would read
    as numeric character references.
    """
    text = clip(one_line(value), limit)
    if not text:
        return ""
    if cell and "\\|" in text:
        return "<code>" + "".join(_HTML_CODE_ENTITIES.get(c, c) for c in text) + "</code>"
    fence = "`" * (max((len(m) for m in _BACKTICK_RUN.findall(text)), default=0) + 1)
    body = text.replace("|", "\\|") if cell else text
    pad = " " if (text[0] in "` " or text[-1] in "` ") and text.strip(" ") else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def md_code_text(value: object) -> str:
    """An identifier (a pattern id) for a single-backtick span the caller writes: one line, pipes
    escaped, a backtick (never in a real id) written as an apostrophe. The digest and history keep
    this form; names from traces and files use ``md_code``, which keeps every character."""
    return one_line(value).replace("`", "'").replace("|", "\\|")


def md_text(value: object, limit: int | None = None) -> str:
    """User text (job, team, owner, file and function names) for Markdown: literal, never markup.

    `& < >` become entities (no raw HTML such as `<script>` or `<img onerror>` reaches the page),
    Markdown punctuation (backslash, backtick, `*`, `[`, `]`, `|`, `~`, and `_` where it could
    start or end emphasis) is backslash-escaped, and line breaks and control characters become
    spaces. Safe in table cells and in running text alike.
    """
    if value is None:
        return ""
    text = clip(one_line(value), limit)
    text = _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), text)
    return "".join(_MD_ENTITIES.get(ch, ch) for ch in text)


# --- numbers -----------------------------------------------------------------------------------------
def _sig(v: float, digits: int = 3) -> str:
    """``digits`` significant digits written out in full: 0.000122, not 1.22e-04 or 0.0001."""
    return format(Decimal(f"{v:.{digits}g}"), "f")


def fmt_fixed(v: float | None, digits: int = 2) -> str:
    """A fixed number of decimals with thousands separators: 13,250.65."""
    return "-" if v is None else f"{v:,.{digits}f}"


def fmt_ms(v: float | None) -> str:
    """Milliseconds to two decimals with separators (13,250.65 ms); a small non-zero value to three
    significant digits (0.00013 ms), never rounded away to 0.00 ms (compare writes it so too)."""
    if v is None:
        return "-"
    if v != 0 and abs(v) < 0.01:
        return f"{_sig(v)} ms"
    return f"{v:,.2f} ms"


def fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def fmt_num(v: Any) -> str:
    """An evidence figure: integers and large values with separators, at most three decimals,
    and small non-zero values to three significant digits rather than rounded to 0."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return str(v)
        if v == int(v) or abs(v) >= 1e6:
            return f"{v:,.0f}"
        if abs(v) < 0.01:
            return _sig(v)
        return f"{v:,.3f}".rstrip("0").rstrip(".")
    return str(v)


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
    return _sig(v)  # 0.0000443, not 4.43e-05 or 0.0000: three digits, no exponent


def fmt_usd(v: float | None) -> str:
    """Dollars: whole above $100, cents above one cent, two significant digits below ($0.0034)."""
    if v is None:
        return "-"
    a = abs(v)
    if a == 0:
        return "$0"
    if a >= 100:
        return f"${v:,.0f}"
    if a >= 0.01:
        return f"${v:,.2f}"
    return "$" + _sig(v, 2)


def fmt_change(v: float | None) -> str:
    if v is None:
        return "new"
    if abs(v) < 0.5:
        return "→ 0%"
    return f"{'↑' if v > 0 else '↓'} {abs(v):.0f}%"


def plural(n: int | float | None, singular: str, plural_form: str | None = None) -> str:
    """``n`` with its noun: "1 step", "5 steps", "1,024 kernels"."""
    n = 0 if n is None else n
    count = f"{int(n):,}" if float(n).is_integer() else f"{n:,.1f}"
    return f"{count} {singular if n == 1 else (plural_form or singular + 's')}"


def rank_files(job: Any) -> str:
    """How many ranks were read from how many files: "8 rank files"; "8 ranks in 1 file" for a
    `trace merge` output, which the loader splits into its ranks."""
    ranks = getattr(job, "ranks", None) or []
    files = len({r.path for r in ranks})
    return plural(len(ranks), "rank file") if files == len(ranks) else f"{plural(len(ranks), 'rank')} in {plural(files, 'file')}"


def thousands(text: object) -> str:
    """Millisecond figures of four or more integer digits in prose (the bottleneck summary) with
    thousands separators, as the tables write them: "13,250.65 ms"."""
    def sep(m: re.Match[str]) -> str:
        whole, _, frac = m.group(0).partition(".")
        return f"{int(whole):,}" + (f".{frac}" if frac else "")
    return _BIG_MS.sub(sep, "" if text is None else str(text))


# --- hardware ----------------------------------------------------------------------------------------
_ACCELERATOR_WORDS = {
    "nvidia": "NVIDIA GPU",
    "amd": "AMD GPU",
    "mtia": "MTIA accelerator (no CUDA/ROCm GPU events)",
    "none": "CPU-only (no GPU or accelerator in the trace)",
    "unknown": "unknown",
}


def hardware(job: Any) -> str:
    """What the trace ran on: its device names, else a word for the accelerator kind."""
    ranks = getattr(job, "ranks", None) or []
    if not ranks:
        return "unknown"
    if ranks[0].devices:
        return ", ".join(ranks[0].devices)
    return _ACCELERATOR_WORDS.get(ranks[0].accelerator, ranks[0].accelerator)


def bottleneck_summary(summary: str, features: dict[str, Any] | None = None) -> str:
    """The classifier's sentence with the reports' number style. A findings.json of an earlier version
    said "host time (no GPU in this trace)" of an accelerator trace (MTIA: no CUDA/ROCm GPU events, yet
    not a CPU-only job): said precisely here (the classifier now words it so itself)."""
    text = thousands(summary)
    f = features or {}
    if f.get("has_accelerator") and not f.get("has_gpu"):
        text = text.replace("(no GPU in this trace)", "(no CUDA/ROCm GPU events; accelerator trace)")
    return text


def install(env: Environment) -> Environment:
    """Register the shared filters on a report environment."""
    env.filters.update({
        "code": md_code, "code_text": md_code_text, "md": md_text, "clip": clip, "one_line": one_line,
        "ms": fmt_ms, "fixed": fmt_fixed, "num": fmt_num, "gh": fmt_gh, "usd": fmt_usd, "pct": fmt_pct,
        "change": fmt_change, "plural": plural, "thousands": thousands, "hardware": hardware,
        "rank_files": rank_files,
    })
    return env
