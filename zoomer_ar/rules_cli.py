"""`zoomer-ar rules list|explain`: the rule catalogue (rules/), printed like ruff's rule pages.

The pages are the detect stage's (detect/pages.py); this front end adds what only the fix stage knows: which
fixers a rule's fix runs and which of them are opt-in (read from the fixers' files without importing them:
fix/catalogue.py)."""

from __future__ import annotations

import click

from .detect.pages import explain_text, list_line, suggest
from .detect.rules import Rule, load_rules
from .errors import InputError
from .fix.catalogue import FACT_UNLOCKS, UnknownId, entries, select_ids


def fixers_of(rule: Rule) -> list[tuple[str, bool]] | None:
    """(name, opt-in) of each fixer `--select <the rule's fixers>` runs; None where the catalogue does not read
    statically (the page then names the command only)."""
    if not rule.fix.fixers:
        return []
    cat = entries()
    if cat is None:
        return None
    try:
        return [(e.name, e.opt_in) for e in select_ids(cat, rule.fix.fixers)]
    except UnknownId:
        return None


@click.group()
def rules() -> None:
    """The anti-pattern catalogue (rules/)."""


@rules.command("list")
def list_rules() -> None:
    """One line per rule: id, category, title and, for a rule with an automatic fix, [fix: IDS]
    (`zoomer-ar fix DIR --select IDS` runs its fixers; `rules explain ID` says more)."""
    rs = load_rules()
    width = max(len(r.id) for r in rs)
    for r in rs:
        click.echo(list_line(r, width))


@rules.command("explain")
@click.argument("rule_id")
def explain(rule_id: str) -> None:
    """What a rule detects, why it costs time, an example, the fix (exit 2 for an unknown id)."""
    rs = {r.id: r for r in load_rules()}
    if rule_id not in rs:  # a wrong id is bad input (exit 2), not a broken catalogue (RuleError, exit 1)
        hint = suggest(rule_id, list(rs))
        did_you_mean = f"did you mean {hint}? " if hint else ""
        raise InputError(None, f"no rule with id {rule_id!r} ({did_you_mean}see `zoomer-ar rules list`)")
    click.echo(explain_text(rule_id, fixers_of(rs[rule_id]), unlock_words()), nl=False)


def unlock_words() -> dict[str, str]:
    """FACT_UNLOCKS in words: when analyze's patch.diff takes an opt-in fixer without --fix-select."""
    return {name: f"the job's recorded facts (job.json) say {section}.{key} is true"
                  + (" and the trace shows no accelerator" if host_only else "")
            for name, (section, key, host_only) in FACT_UNLOCKS.items()}


commands = [rules]
