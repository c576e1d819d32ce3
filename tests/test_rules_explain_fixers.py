"""`zoomer-ar rules explain` names the fixers a rule's fix runs and says which are opt-in (the fix stage's
facts, read by the rules front end: zoomer_ar/rules_cli.py), checked against the fixer registry itself."""

from __future__ import annotations

import re

import pytest

from zoomer_ar.cli import main
from zoomer_ar.detect.rules import load_rules
from zoomer_ar.fix.catalogue import FACT_UNLOCKS
from zoomer_ar.fix.registry import load_registry

REGISTRY = load_registry()
WITH_FIXERS = [r for r in load_rules() if r.fix.fixers]


def _page(capsys, rule_id: str) -> str:
    assert main(["rules", "explain", rule_id]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("rule", WITH_FIXERS, ids=[r.id for r in WITH_FIXERS])
def test_page_names_the_fixers_the_command_runs_and_the_opt_in_ones(rule, capsys):
    page = _page(capsys, rule.id)
    ran = REGISTRY.resolve(rule.fix.fixers)  # what `zoomer-ar fix --select <the rule's fixers>` runs
    line = next(ln for ln in page.splitlines() if ln.startswith("Automatic fix:"))
    assert f"--select {','.join(rule.fix.fixers)} --diff" in line
    named = re.findall(r"`([a-z0-9-]+)`", line.split(" runs ", 1)[1])
    assert named == sorted(f.name for f in ran)
    opt_in = sorted(f.name for f in ran if f.opt_in)
    opt_line = [ln for ln in page.splitlines() if ln.startswith("Opt-in:")]
    if not opt_in:
        assert not opt_line
        return
    assert len(opt_line) == 1 and re.findall(r"^Opt-in: (.*?) changes? ", opt_line[0])
    assert sorted(re.findall(r"`([a-z0-9-]+)`", opt_line[0].split(" change", 1)[0])) == opt_in
    assert f"--fix-select {','.join(opt_in)}`" in opt_line[0]
    for name in opt_in:  # where analyze takes one unasked, the page says when
        assert (f"takes `{name}` unasked" in page) == (name in FACT_UNLOCKS)


def test_ddp_bucket_view_is_extra_copys_opt_in_fixer(capsys):
    """DDP's copies of the gradients into its buckets are DtoD memcpys during backward: extra-copy's measure,
    not exposed communication (whose page says the setting hides no communication)."""
    assert {f.name: f.pattern for f in REGISTRY.fixers}["ddp-bucket-view"] == "extra-copy"
    page = _page(capsys, "extra-copy")
    assert "gradient_as_bucket_view=True" in page and "Opt-in: `ddp-bucket-view` changes" in page
    comm = _page(capsys, "exposed-communication")
    assert "Automatic fix:" not in comm and "ddp-bucket-view" not in comm


def test_fp32_matmul_page_says_when_analyze_applies_cpu_autocast(capsys):
    page = _page(capsys, "fp32-matmul")
    assert "Except: analyze's patch.diff takes `cpu-autocast` unasked where the job's recorded facts (job.json) " \
           "say cpu.native_bf16 is true and the trace shows no accelerator." in page


def test_rules_list_and_explain_import_no_fixer_module(tmp_path):
    """The pages read the fixers' names from their files: no fixer module (nor libcst) is imported."""
    import subprocess
    import sys

    code = ("import sys\nfrom zoomer_ar.cli import main\nrc = main(['rules', 'explain', 'extra-copy'])\n"
            "print('LOADED', ' '.join(m for m in sys.modules if m.startswith(('libcst', 'zoomer_ar_fixers'))"
            " or m == 'zoomer_ar.fix.registry'))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    loaded = proc.stdout.rsplit("LOADED", 1)[1].split()
    assert loaded == [], loaded
