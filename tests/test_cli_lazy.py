"""The command line imports a command's module only when that command runs: `zoomer-ar analyze` used to
import the service, the review bot, the trainer and the fixers first (about 1 s of imports on this VM).
The table of commands is checked against the modules' own `commands` lists."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

from zoomer_ar.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[1]


def test_the_table_names_every_command_of_every_module():
    found = {}
    for module in set(COMMANDS.values()):
        for command in importlib.import_module(module).commands:
            found[command.name] = module
    assert found == COMMANDS


def _modules_after(args: list[str]) -> set[str]:
    code = ("import sys\nfrom zoomer_ar.cli import main\nrc = main(sys.argv[1:])\n"
            "print('MODULES', ' '.join(sorted(m for m in sys.modules if m.startswith('zoomer_ar'))))\n"
            "print('RC', rc)\n")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=300)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("MODULES", "RC")))
    assert lines["RC"] == "0", proc.stderr
    return set(lines["MODULES"].split())


def test_analyze_imports_only_what_it_uses(tmp_path):
    mods = _modules_after(["analyze", str(REPO / "examples/traces/clean"), "--out", str(tmp_path / "out"),
                           "--no-progress"])
    assert "zoomer_ar.analyze_cli" in mods and "zoomer_ar.features" in mods
    for unused in ("zoomer_ar.service", "zoomer_ar.review", "zoomer_ar.learn.train", "zoomer_ar.surgery",
                   "zoomer_ar.store.cli"):
        assert unused not in mods, unused


def test_rules_list_imports_no_other_command():
    mods = _modules_after(["rules", "list"])
    assert "zoomer_ar.rules_cli" in mods
    assert not {m for m in set(COMMANDS.values()) - {"zoomer_ar.rules_cli"} if m in mods}


def test_help_and_version_still_list_everything(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in COMMANDS)
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("zoomer-ar, version ") and "\nreader: " in out


def test_unknown_command_is_a_usage_error(capsys):
    assert main(["analyse"]) == 2
    assert "No such command 'analyse'" in capsys.readouterr().err
