"""The commands' --help says what the commands do: an option `analyze` refuses without --record says so."""

from __future__ import annotations

import click
import pytest

from zoomer_ar.analyze_cli import analyze
from zoomer_ar.store.options import refuse_record_only

STORE_OPTIONS = [p for p in analyze.params
                 if isinstance(p, click.Option) and p.name in {"job", "team", "owner", "gpu_type", "gpus", "gpu_hours",
                                                               "gpu_hour_cost", "week", "recorded_at", "db"}]


def _refused_without_record(name: str) -> bool:
    try:
        refuse_record_only({name: "x"})
    except click.UsageError:
        return True
    return False


@pytest.mark.parametrize("option", STORE_OPTIONS, ids=lambda p: p.opts[0])
def test_analyze_help_says_which_store_options_need_record(option):
    """`analyze --help` listed --team, --week, --db... as plain options; given without --record each is a
    usage error ('--team needs --record'). The help now says so for exactly those options: --gpus,
    --gpu-hours and --gpu-hour-cost set the reports' cost figures without --record."""
    assert len(STORE_OPTIONS) == 10
    says = option.help.endswith("Needs --record.")
    assert says == _refused_without_record(option.name), option.opts[0]
