"""The rule catalogue's pages, printed like ruff's rule pages: `rules list`'s lines and `rules explain`'s page
(the commands: zoomer_ar/rules_cli.py, which also says which fixers a rule's fix runs and which are opt-in: the
fix stage comes after this one)."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence

from .rules import Rule, get_rule


def list_line(r: Rule, width: int) -> str:
    """`rules list`'s line: id, category, title and, for a rule with an automatic fix, [fix: IDS]."""
    fixers = f"  [fix: {', '.join(r.fix.fixers)}]" if r.fix.fixers else ""
    return f"{r.id:<{width}}  {r.category:<15} {r.title}{fixers}"


SEVERITY_ORDER = ("info", "low", "medium", "high", "critical")


def _setting(v: object) -> str:
    """A relaunch value as the command line takes it: JSON for booleans, lists and maps."""
    return json.dumps(v) if isinstance(v, (bool, list, dict)) or v is None else str(v)


def _relaunch_lines(relaunch: dict) -> list[str]:
    """The rule's relaunch settings, one bullet per kind, each setting as `key=value`."""
    words = {"config_overrides": "config overrides", "env": "environment"}
    lines = []
    for kind, value in relaunch.items():
        if isinstance(value, dict):
            items = ", ".join(f"`{k}={_setting(v)}`" for k, v in value.items())
            lines.append(f"- {words.get(kind, kind.replace('_', ' '))}: {items}")
        elif kind == "notes":
            lines.append(f"- note: {' '.join(str(value).split())}")
        else:
            lines.append(f"- {kind.replace('_', ' ')}: `{_setting(value)}`")
    return lines


def _severity_line(r) -> str:
    """How the rule's severity is set, in words: fixed, or impact_pct bands down to min_severity."""
    if r.fixed_severity:
        return (f"- severity: always {r.fixed_severity} (`fixed_severity`: set by the rule, whatever the "
                "measured impact)")
    b = r.severity_bands
    floor = SEVERITY_ORDER.index(r.min_severity)
    bands = [(name, getattr(b, name)) for name in ("critical", "high", "medium", "low")
             if SEVERITY_ORDER.index(name) > floor]
    ladder = ", ".join(f"{name} from {threshold:g}%" for name, threshold in bands)
    return (f"- severity: from `impact_pct`: {ladder}, otherwise {r.min_severity} (`min_severity`: the lowest "
            "severity a finding of this rule gets, however small its impact)")


# the kinds of trace a rule words apart (detect/rules.py HardwareText), as a page names them
HARDWARE_WORDING = (("on_cpu", "On CPU-only traces"), ("on_rocm", "On AMD GPUs (ROCm, HIP runtime)"))


def _worded_apart(r, field: str) -> list[str]:
    """The rule's own wording of `field` for each kind of trace that has one, a paragraph each."""
    lines = []
    for block, words in HARDWARE_WORDING:
        text = getattr(getattr(r, block), field)
        if text:
            lines += [f"{words}:", text.strip(), ""]  # the label on a line of its own: the text comes wrapped
    return lines


def _fix_lines(r: Rule, fixers: Sequence[tuple[str, bool]] | None, unlocks: Mapping[str, str]) -> list[str]:
    """The automatic-fix paragraph: the command, the fixers it runs (`fixers`: (name, opt-in) of each, as the
    fix stage's catalogue has them; None where it was not read) and what an opt-in fixer asks for (`unlocks`:
    the recorded job facts that put an opt-in fixer in analyze's patch.diff, in words)."""
    command = f"`zoomer-ar fix DIR --select {','.join(r.fix.fixers)} --diff`"
    if not fixers:
        return [f"Automatic fix: {command}", ""]
    opt = [n for n, opt_in in fixers if opt_in]
    lines = [f"Automatic fix: {command} runs {_words([f'`{n}`' for n, _ in fixers])}.", ""]
    if opt:
        it = "it" if len(opt) == 1 else "them"
        lines += [f"Opt-in: {_words([f'`{n}`' for n in opt])} {'changes' if len(opt) == 1 else 'change'} more than "
                  f"the anti-pattern (the caveats: docs/fixers.md). `zoomer-ar fix` without `--select` and `zoomer-ar "
                  f"analyze`'s patch.diff only report {it}; the command above applies {it}, as does `zoomer-ar analyze "
                  f"--fix-select {','.join(opt)}`.", ""]
        lines += [f"Except: analyze's patch.diff takes `{n}` unasked where {unlocks[n]}.\n" for n in opt if n in unlocks]
    return lines


def _words(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def explain_text(rule_id: str, fixers: Sequence[tuple[str, bool]] | None = None,
                 unlocks: Mapping[str, str] | None = None) -> str:
    """The rule's page; `fixers`: (name, opt-in) of the fixers its fix runs, where the caller has read them;
    `unlocks`: when analyze applies an opt-in one unasked (see _fix_lines)."""
    r = get_rule(rule_id)
    lines = [f"# {r.id}: {r.title}", ""]
    for block, words in HARDWARE_WORDING:
        if (title := getattr(r, block).title):
            lines += [f"{words} the finding is titled: {title.strip()}", ""]
    lines += [f"Category: {r.category}", "", "## What it detects", "", r.summary, ""]
    lines += ["## Why it costs time", "", r.explanation.strip(), ""] + _worded_apart(r, "explanation")
    if r.example:
        lines += ["## Example", "", r.example.strip(), ""]
    lines += ["## How to fix it", "", r.recommendation.strip(), ""] + _worded_apart(r, "recommendation")
    if r.fix.fixers:
        lines += _fix_lines(r, fixers, unlocks or {})
    if r.fix.relaunch:
        lines += ["Relaunch settings (`zoomer-ar relaunch` applies them to the recorded command):", ""]
        lines += _relaunch_lines(r.fix.relaunch) + [""]
    if r.fix.unless:  # what a finding adds where its fix does not apply
        when = " ".join(r.fix.when.split())
        lines += [f"Where `{when}` does not hold, no fix is offered and the finding adds:", r.fix.unless.strip(), ""]
        lines += _worded_apart(r, "unless")
    lines += ["## How it is measured", ""]
    applies = " ".join(str(r.applies_when).split())
    lines += ["- applies to: every trace" if applies in ("True", "") else f"- applies when: `{applies}`"]
    measured = " ".join((r.condition, str(r.confidence)))
    lines += [f"- fires when: `{' '.join(r.condition.split())}`",
              f"- impact (ms per step): `{' '.join(r.impact_ms.split())}`"]
    if "impact_pct" in measured or not r.fixed_severity:
        lines += ["- `impact_pct`: that impact as a percentage of the step (100 x impact / `step_ms`, the impact "
                  "capped at the whole step)"]
    if re.search(r"\bimpact_ms\b", measured):
        lines += ["- `impact_ms`: that impact in ms per step, capped at the whole step"]
    lines += [f"- confidence: `{' '.join(str(r.confidence).split())}`", _severity_line(r)]
    if r.figures:
        lines += [f"- evidence figures: {', '.join(r.figures)}"]
    if r.within:
        lines += [f"- part of `{r.within}`: its time is a part of {r.within}'s, and combined gains count the two once"]
    if r.references:
        lines += ["", "## References", ""] + [f"- {u}" for u in r.references]
    return "\n".join(lines) + "\n"


def suggest(rule_id: str, known: list[str]) -> str | None:
    """The rule id closest to a mistyped one (`sync_point`, `Sync-Point`, `sync-pont`), if any."""
    normal = "-".join(rule_id.strip().lower().replace("_", "-").split())
    if normal in known:
        return normal
    close = difflib.get_close_matches(normal, known, n=1, cutoff=0.6)
    return close[0] if close else None
