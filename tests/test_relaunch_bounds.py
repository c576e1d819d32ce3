"""Relaunch specs the command line can carry as written: torchrun's layout once (launcher_args may not repeat
command.nnodes/nproc_per_node: the command carried `--nnodes` twice, torchrun taking the last), within bounds
(a spec asking for 10**9 processes per node was run), and launcher_args torchrun takes (a `false` flag left out,
not `--standalone=False`; names without dashes; none on a plain python launch, where they were dropped unsaid)."""

from __future__ import annotations

import pytest
import yaml

from zoomer_ar.cli import main
from zoomer_ar.models import Analysis, Bottleneck, JobInfo, RankInfo
from zoomer_ar.relaunch import RelaunchSpec, load_spec, render_spec
from zoomer_ar.relaunch.spec import MAX_NNODES, MAX_NPROC_PER_NODE, Command, spec_from_analysis


def _spec_file(tmp_path, launcher="torchrun", nnodes=2, nproc=8, launcher_args=None):  # noqa: ANN001, ANN201
    """A spec as analyze writes it, with its YAML then edited as a user would."""
    spec = RelaunchSpec(job="j", command=Command(launcher=launcher, script="train.py"))
    doc = yaml.safe_load(render_spec(spec))
    doc["command"]["nnodes"], doc["command"]["nproc_per_node"] = nnodes, nproc
    doc["launcher_args"] = launcher_args or {}
    path = tmp_path / "relaunch.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def _refused(capsys, path: str, *says: str) -> None:  # noqa: ANN001
    assert main(["relaunch", path, "--dry-run"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and path in err[0] and all(s in err[0] for s in says), err
    assert "internal error" not in err[0] and captured.out == ""


@pytest.mark.parametrize("key,field", [("nnodes", "nnodes"), ("nproc_per_node", "nproc_per_node"),
                                       ("nproc-per-node", "nproc_per_node"), ("nnode", "nnodes")])
def test_launcher_args_may_not_repeat_the_commands_layout(tmp_path, capsys, key, field):
    path = _spec_file(tmp_path, launcher_args={key: 4})
    _refused(capsys, path, f"launcher_args.{key} repeats command.{field}", "twice")


@pytest.mark.parametrize("field,value,top", [("nproc_per_node", 10**9, MAX_NPROC_PER_NODE),
                                             ("nproc_per_node", MAX_NPROC_PER_NODE + 1, MAX_NPROC_PER_NODE),
                                             ("nnodes", 10**7, MAX_NNODES)])
def test_a_layout_past_any_machine_is_refused(tmp_path, capsys, field, value, top):
    path = _spec_file(tmp_path, **{"nproc" if field == "nproc_per_node" else "nnodes": value})
    _refused(capsys, path, f"command.{field}", str(top))


def test_the_largest_layout_still_runs(tmp_path, capsys):
    path = _spec_file(tmp_path, nnodes=MAX_NNODES, nproc=MAX_NPROC_PER_NODE)
    assert main(["relaunch", path, "--dry-run"]) == 0
    assert f"torchrun --nnodes={MAX_NNODES} --nproc_per_node={MAX_NPROC_PER_NODE} train.py" in capsys.readouterr().out


@pytest.mark.parametrize("args,says", [
    ({"nproc_per_node": 10**9}, "not a count from 1 to 1,024"),
    ({"nproc_per_node": "lots"}, "'lots' is not a count"),
    ({"nnodes": "4:2"}, "more nodes at least (4) than at most (2)"),
    ({"nnodes": "1:999999"}, "'999999' is not a count from 1 to 65,536"),
    ({"nnodes": True}, "True is not a count"),
    ({"--standalone": True}, "not a torchrun option name"),
    ({"rdzv endpoint": "h:1"}, "not a torchrun option name"),
])
def test_launcher_args_torchrun_cannot_take_are_refused(tmp_path, capsys, args, says):
    path = _spec_file(tmp_path, nnodes=None, nproc=None, launcher_args=args)
    _refused(capsys, path, "launcher_args", says)


def test_launcher_args_carry_the_layout_once_when_the_command_does_not(tmp_path, capsys):
    path = _spec_file(tmp_path, nnodes=None, nproc=None,
                      launcher_args={"nnodes": "1:4", "nproc-per-node": "gpu", "standalone": False, "max_restarts": 3})
    assert main(["relaunch", path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "torchrun --max_restarts=3 --nnodes=1:4 --nproc-per-node=gpu train.py" in out, out
    assert out.count("--nnodes") == 1 and "standalone" not in out


def test_launcher_args_on_a_python_launch_are_refused(tmp_path, capsys):
    path = _spec_file(tmp_path, launcher="python", nnodes=None, nproc=None, launcher_args={"standalone": True})
    _refused(capsys, path, "launcher_args (standalone) are torchrun's options", "command.launcher is python")


def _analysis(world: int) -> Analysis:
    return Analysis(tool_version="0.1.0", feature_schema_version="1.0.0",
                    job=JobInfo(name="big", path="", world_size=world, ranks=[
                        RankInfo(path="rank0.json", rank=0, rank_source="default", sha256="0" * 64, size_bytes=1,
                                 n_events=1, devices=[])]),
                    features={}, bottleneck=Bottleneck(type="unknown", shares={}, summary=""), findings=[])


@pytest.mark.parametrize("job", [{}, {"local_world_size": 5000, "nnodes": 1}])
def test_analyze_never_writes_a_layout_the_spec_refuses(tmp_path, job):
    """A 5000-rank job whose layout is unknown (or recorded as 5000 processes on one node) made a spec of
    --nproc_per_node=5000; now it leaves the layout to the user, with a note, and the spec loads."""
    spec = spec_from_analysis(_analysis(5000), argv=["train.py"], job=job)
    assert spec.command.nproc_per_node is None and spec.command.nnodes is None
    assert any("more than 1,024 cannot start on one node" in n for n in spec.notes), spec.notes
    path = tmp_path / "relaunch.yaml"
    path.write_text(render_spec(spec))
    assert load_spec(path).command.launcher == "torchrun"


@pytest.mark.parametrize("args", [["train.py", "--out", "runs/before"], ["train.py", "--out=runs/before"]])
def test_the_note_on_a_replayed_out_names_the_folder_and_what_capture_does(args):
    from zoomer_ar.relaunch.spec import _out_note

    note = _out_note(args)
    assert "--out runs/before" in note and "zoomer-ar compare" in note
    assert "zoomer_ar.capture refuses" in note  # the capture helper no longer writes over an earlier capture
    assert _out_note(["train.py", "--output", "x"]) is None
