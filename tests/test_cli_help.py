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


def test_a_finding_an_opt_in_fixer_could_fix_is_not_called_unfixable(tmp_path, capsys):
    """fp32-matmul on the CPU recording: matmul-precision (CUDA only) changes nothing, and the opt-in
    cpu-autocast, which does rewrite the program, is held back. The note said 'no automatic fix for
    fp32-matmul ... its recommendation says what to do' just above the line naming cpu-autocast as
    left out; it now names the opt-in fixer and the option that adds it, and that option does."""
    import shutil
    from pathlib import Path

    from zoomer_ar.cli import main

    repo = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    shutil.copytree(repo / "training_data" / "scenarios", src)
    trace = repo / "examples" / "traces" / "fp32_matmul"
    assert main(["analyze", str(trace), "--source", str(src), "--out", str(tmp_path / "a"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "no automatic fix for fp32-matmul" not in err
    assert ("patch.diff has no fix for fp32-matmul: matmul-precision found nothing to change in fp32_matmul.py; "
            "the opt-in cpu-autocast was left out (--fix-select cpu-autocast adds it)") in err
    assert not (tmp_path / "a" / "patch.diff").exists()
    assert main(["analyze", str(trace), "--source", str(src), "--out", str(tmp_path / "b"), "--no-progress",
                 "--fix-select", "cpu-autocast"]) == 0
    assert "torch.autocast" in (tmp_path / "b" / "patch.diff").read_text()


def test_a_mistyped_command_names_the_closest_one(capsys):
    """`zoomer-ar anlyze x` said only "No such command 'anlyze'": click suggests from the commands a group
    has loaded, and the top-level group loads them on first use. `rules lst` was already helped."""
    from zoomer_ar.cli import main

    assert main(["anlyze", "trace.json"]) == 2
    assert "No such command 'anlyze'. Did you mean 'analyze'?" in capsys.readouterr().err
    assert main(["xyzzy"]) == 2
    assert "Did you mean" not in capsys.readouterr().err
