"""`zoomer-ar rules list|explain`: the rule catalogue, printed like ruff's rule pages."""

from __future__ import annotations

import click

from ..errors import InputError
from .rules import get_rule, load_rules


@click.group()
def rules() -> None:
    """The anti-pattern catalogue (rules/)."""


@rules.command("list")
def list_rules() -> None:
    """One line per rule: id, category, title."""
    rs = load_rules()
    width = max(len(r.id) for r in rs)
    for r in rs:
        fixers = f"  [fix: {', '.join(r.fix.fixers)}]" if r.fix.fixers else ""
        click.echo(f"{r.id:<{width}}  {r.category:<15} {r.title}{fixers}")


def explain_text(rule_id: str) -> str:
    r = get_rule(rule_id)
    lines = [f"# {r.id}: {r.title}", "", f"Category: {r.category}", "", "## What it detects", "", r.summary, ""]
    lines += ["## Why it costs time", "", r.explanation.strip(), ""]
    if r.example:
        lines += ["## Example", "", r.example.strip(), ""]
    lines += ["## How to fix it", "", r.recommendation.strip(), ""]
    if r.fix.fixers:
        lines += [f"Automatic fix: `zoomer-ar fix DIR --select {','.join(r.fix.fixers)} --diff`", ""]
    if r.fix.relaunch:
        lines += ["Relaunch settings:", ""] + [f"- {k}: {v}" for k, v in r.fix.relaunch.items()] + [""]
    lines += ["## How it is measured", "", f"- applies when: `{r.applies_when}`", f"- fires when: `{r.condition}`",
              f"- impact (ms per step): `{r.impact_ms}`", f"- confidence: `{r.confidence}`"]
    if r.figures:
        lines += [f"- evidence figures: {', '.join(r.figures)}"]
    if r.within:
        lines += [f"- part of `{r.within}`: its time is a part of {r.within}'s, and combined gains count the two once"]
    if r.references:
        lines += ["", "## References", ""] + [f"- {u}" for u in r.references]
    return "\n".join(lines) + "\n"


@rules.command("explain")
@click.argument("rule_id")
def explain(rule_id: str) -> None:
    """What a rule detects, why it costs time, an example, the fix (exit 2 for an unknown id)."""
    known = [r.id for r in load_rules()]
    if rule_id not in known:  # a wrong id is bad input (exit 2), not a broken catalogue (RuleError, exit 1)
        raise InputError(None, f"no rule with id {rule_id!r} (see `zoomer-ar rules list`)")
    click.echo(explain_text(rule_id), nl=False)


commands = [rules]
