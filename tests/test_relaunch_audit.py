"""Relaunch audit: no workers for loaders over iterable-style datasets and no option given twice;
Hydra overrides fitted to the program's config; expected_gain from the fixes the relaunch carries;
where the job runs (cwd, schema 1.2) and how its ranks were spread over nodes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import git_repo
from zoomer_ar.cli import main
from zoomer_ar.models import Analysis
from zoomer_ar.relaunch import RelaunchSpec, json_schema, load_spec, render_spec, spec_from_analysis
from zoomer_ar.relaunch.spec import Command

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "examples" / "gpu"
SCENARIOS = REPO / "training_data" / "scenarios"
RECORDED_CWD = json.loads((GPU / "dataloader_bound" / "job.json").read_text())["cwd"]




def analyze(trace: Path, out: Path, source: Path | None = None) -> None:
    args = ["analyze", str(trace), "--out", str(out), "--no-progress"] + (["--source", str(source)] if source else [])
    assert main(args) == 0


@pytest.fixture(scope="module")
def dl_analysis(tmp_path_factory) -> Analysis:
    """examples/gpu/dataloader_bound analysed (dataloader-bound, idle-gpu), with examples/gpu/launch_bound's
    launch-bound finding added: a job with both fixes to relaunch (workers and compile). The shipped model
    before v0002 reported launch-bound on dataloader_bound itself, where the rule stays quiet (the GPU waits
    for data); these tests are about the spec built from such findings, not about detecting them."""
    out = tmp_path_factory.mktemp("dl") / "o"
    analyze(GPU / "dataloader_bound", out)
    analysis = Analysis(**json.loads((out / "findings.json").read_text()))
    out_lb = tmp_path_factory.mktemp("lb") / "o"
    analyze(GPU / "launch_bound", out_lb)
    launch = next(f for f in Analysis(**json.loads((out_lb / "findings.json").read_text())).findings
                  if f.pattern == "launch-bound")
    analysis = analysis.model_copy(update={"findings": [*analysis.findings, launch]})
    assert {"dataloader-bound", "launch-bound"} <= {f.pattern for f in analysis.findings}
    return analysis


def program(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return src


# -- 1. workers and iterable-style datasets; an option replaced, not given twice ------------------

ITERABLE_ARGPARSE = '''\
import argparse
from torch.utils.data import DataLoader, IterableDataset


class Stream(IterableDataset):
    def __iter__(self):
        yield from range(8)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--num-workers", type=int, default=0)
    args = p.parse_args()
    loader = DataLoader(Stream(), batch_size=2, num_workers=args.num_workers)
'''

MAP_ARGPARSE = ITERABLE_ARGPARSE.replace("IterableDataset", "Dataset").replace(
    "    def __iter__(self):\n        yield from range(8)\n",
    "    def __len__(self):\n        return 8\n\n    def __getitem__(self, i):\n        return i\n",
).replace('p.add_argument("--num-workers"', 'p.add_argument("-j", "--num-workers"')


def test_scenario_on_an_iterable_dataset_gets_no_workers(tmp_path, capsys):
    """The audit's case: dataloader_bound.py rewritten on an IterableDataset subclass with
    --num-workers, recorded with --num-workers 0: the dry run printed `... --num-workers 0
    --num-workers=4` (every sample yielded 4 times)."""
    src = tmp_path / "src"
    shutil.copytree(SCENARIOS, src)
    script = src / "dataloader_bound.py"
    text = script.read_text()
    for old, new in [
        ("from torch.utils.data import DataLoader, Dataset",
         "import argparse\nfrom torch.utils.data import DataLoader, IterableDataset"),
        ("class SyntheticImages(Dataset):", "class SyntheticImages(IterableDataset):"),
        ("    def __getitem__(self, i):",
         "    def __iter__(self):\n        for i in range(self.n):\n            yield self._get(i)\n\n"
         "    def _get(self, i):"),
        ("loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=0)",
         "loader = DataLoader(ds, batch_size=BATCH, num_workers=args.num_workers)"),
        ("    args = parse_args(__doc__)",
         "    p = argparse.ArgumentParser()\n    p.add_argument('--out')\n"
         "    p.add_argument('--num-workers', type=int, default=0)\n    args = p.parse_args()"),
    ]:
        assert old in text
        text = text.replace(old, new)
    script.write_text(text)
    git_repo(src)
    trace = tmp_path / "trace"
    shutil.copytree(GPU / "dataloader_bound", trace)
    job = json.loads((trace / "job.json").read_text())
    job["argv"] = ["dataloader_bound.py", "--out", "/tmp/x", "--num-workers", "0"]
    (trace / "job.json").write_text(json.dumps(job))
    analyze(trace, tmp_path / "o", src)
    capsys.readouterr()
    assert main(["relaunch", str(tmp_path / "o" / "relaunch.yaml"), "--dry-run", "--cwd", str(src)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "python dataloader_bound.py --out /tmp/x --num-workers 0"
    spec = load_spec(tmp_path / "o" / "relaunch.yaml")
    note = next(n for n in spec.notes if n.startswith("Workers not raised"))
    assert "dataloader_bound.py:" in note and "iterable-style" in note and "dataloader.num_workers=4" in note
    assert "dataloader-bound" not in spec.expected_gain.from_findings


def test_iterable_dataset_workers_left_out(dl_analysis, tmp_path):
    src = program(tmp_path, {"train.py": ITERABLE_ARGPARSE})
    spec = spec_from_analysis(dl_analysis, argv=["train.py", "--out", "o2", "--num-workers", "0"], source_dir=src)
    assert spec.argv() == ["python", "train.py", "--out", "o2", "--num-workers", "0"]
    assert spec.config_overrides == {}
    assert any(n.startswith("Workers not raised") and "train.py:" in n for n in spec.notes)


def test_a_literal_iterable_loader_does_not_stop_a_settable_map_style_one(dl_analysis, tmp_path):
    """Only loaders a command-line setting reaches count: one over a stream with num_workers=0
    written in the code is not changed by --num-workers."""
    text = MAP_ARGPARSE + ("\n\nfrom torch.utils.data import IterableDataset\n\n\nclass Tail(IterableDataset):\n"
                           "    def __iter__(self):\n        yield 1\n\n\nside = DataLoader(Tail(), num_workers=0)\n")
    src = program(tmp_path, {"train.py": text})
    spec = spec_from_analysis(dl_analysis, argv=["train.py", "--out", "o2"], source_dir=src)
    assert spec.argv() == ["python", "train.py", "--out", "o2", "--num-workers=4"]


@pytest.mark.parametrize("recorded", [["--num-workers", "0"], ["--num-workers=0"], ["-j", "0"], ["-j0"],
                                      ["--num-w", "0"]])
def test_recorded_option_is_replaced_not_repeated(dl_analysis, tmp_path, recorded):
    src = program(tmp_path, {"train.py": MAP_ARGPARSE})
    spec = spec_from_analysis(dl_analysis, argv=["train.py", *recorded, "--out", "o2"], source_dir=src)
    assert spec.argv() == ["python", "train.py", "--out", "o2", "--num-workers=4"]
    assert "dataloader-bound" in spec.expected_gain.from_findings


# -- 2. Hydra overrides checked against the program's config --------------------------------------

HYDRA_MAIN = '''\
import hydra


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg):
    print(cfg.data.workers)


if __name__ == "__main__":
    main()
'''


def test_hydra_overrides_map_to_the_configs_keys(dl_analysis, tmp_path):
    """The audit's case: conf/config.yaml has data.workers and no compile; the relaunch appended
    `compile=true compile_mode=reduce-overhead dataloader.num_workers=4 ...`, which struct mode rejects."""
    src = program(tmp_path, {"train.py": HYDRA_MAIN, "conf/config.yaml": "data:\n  workers: 0\n  batch: 8\nlr: 0.1\n"})
    spec = spec_from_analysis(dl_analysis, argv=["train.py", "data.workers=0", "lr=0.1"], source_dir=src)
    assert spec.argv() == ["python", "train.py", "lr=0.1", "data.workers=4"]
    assert spec.config_overrides == {"data.workers": 4}
    assert any("dataloader.num_workers as data.workers" in n for n in spec.notes)
    left = next(n for n in spec.notes if n.startswith("Not on the command line"))
    assert "compile=true" in left and "conf/config.yaml" in left and "+key=value" in left
    assert spec.expected_gain.from_findings == ["dataloader-bound"]


def test_hydra_defaults_list_group_and_plus_key_the_program_reads(dl_analysis, tmp_path):
    main_py = HYDRA_MAIN.replace("    print(cfg.data.workers)\n",
                                 "    if cfg.get('compile', False):\n        mode = cfg.get('compile_mode', 'default')\n")
    src = program(tmp_path, {
        "train.py": main_py,
        "conf/config.yaml": "defaults:\n  - loader: fast\n  - _self_\nlr: 0.1\n",
        "conf/loader/fast.yaml": "num_workers: 2\npin_memory: false\n",
        "conf/loader/slow.yaml": "workers: 0\n",
    })
    spec = spec_from_analysis(dl_analysis, argv=["train.py"], source_dir=src)
    assert spec.config_overrides == {"loader.num_workers": 4, "loader.pin_memory": True,
                                     "+compile": True, "+compile_mode": "reduce-overhead"}
    assert "+compile=true" in spec.argv()
    left = next(n for n in spec.notes if n.startswith("Not on the command line"))
    assert "dataloader.persistent_workers=true" in left
    assert set(spec.expected_gain.from_findings) == {"dataloader-bound", "launch-bound"}
    # a group chosen on the recorded command line is the one read
    slow = spec_from_analysis(dl_analysis, argv=["train.py", "loader=slow"], source_dir=src)
    assert slow.config_overrides["loader.workers"] == 4 and "loader.pin_memory" not in slow.config_overrides


def test_hydra_key_matching_more_than_one_is_left_out(dl_analysis, tmp_path):
    src = program(tmp_path, {"train.py": HYDRA_MAIN,
                             "conf/config.yaml": "data:\n  train:\n    workers: 0\n  val:\n    workers: 0\n"})
    spec = spec_from_analysis(dl_analysis, argv=["train.py"], source_dir=src)
    assert not any(k.endswith("workers") for k in spec.config_overrides)
    assert any("data.train.workers" in n and "data.val.workers" in n for n in spec.notes)


def test_hydra_config_is_read_safely_never_run(dl_analysis, tmp_path):
    marker = tmp_path / "ran"
    src = program(tmp_path, {"train.py": HYDRA_MAIN,
                             "conf/config.yaml": f"data: !!python/object/apply:os.system ['touch {marker}']\n"})
    spec = spec_from_analysis(dl_analysis, argv=["train.py"], source_dir=src)
    assert not marker.exists()
    assert any("not checked against the program's Hydra config" in n for n in spec.notes)


# -- 3. expected_gain counts only the fixes the relaunch carries ----------------------------------

def _findings(out: Path) -> dict[str, float]:
    findings = json.loads((out / "findings.json").read_text())["findings"]
    return {f["pattern"]: f["impact"]["pct_of_step"] for f in findings}


def test_gain_counts_only_carried_fixes(tmp_path, capsys):
    """sync_point: launch-bound's fix (torch-compile) is opt-in and not in the patch, compile=true
    only a note: the gain is sync-point's alone, not 94.9% of the step."""
    analyze(GPU / "sync_point", tmp_path / "o", SCENARIOS)
    spec = load_spec(tmp_path / "o" / "relaunch.yaml")
    assert spec.patch == "patch.diff"
    assert spec.expected_gain.from_findings == ["sync-point"]
    assert spec.expected_gain.pct_of_step == pytest.approx(_findings(tmp_path / "o")["sync-point"], abs=1e-3)
    assert any(n.startswith("Not in expected_gain: launch-bound") for n in spec.notes)


def test_no_patch_no_setting_no_gain(tmp_path, capsys):
    analyze(GPU / "pageable_memcpy", tmp_path / "o", SCENARIOS)
    spec = load_spec(tmp_path / "o" / "relaunch.yaml")
    assert spec.patch is None and "pageable-memcpy" in _findings(tmp_path / "o")
    assert spec.expected_gain.from_findings == [] and spec.expected_gain.pct_of_step == 0.0


def test_gain_is_combined_and_capped_at_the_step(dl_analysis, tmp_path):
    dl = next(f for f in dl_analysis.findings if f.pattern == "dataloader-bound")
    big = dl.impact.model_copy(update={"pct_of_step": 80.0})
    churn = dl.model_copy(update={"pattern": "allocator-churn", "impact": big, "fixers": ["allocator-churn"],
                                  "relaunch": {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}})
    analysis = dl_analysis.model_copy(update={"findings": [dl.model_copy(update={"impact": big}), churn]})
    src = program(tmp_path, {"train.py": MAP_ARGPARSE})
    spec = spec_from_analysis(analysis, argv=["train.py"], source_dir=src)
    assert set(spec.expected_gain.from_findings) == {"dataloader-bound", "allocator-churn"}
    assert spec.expected_gain.pct_of_step <= 100.0


# -- 4. where it runs, and on how many nodes -----------------------------------------------------

def test_spec_records_the_recorded_cwd(dl_analysis):
    spec = spec_from_analysis(dl_analysis, argv=["dataloader_bound.py", "--out", "x"])
    assert spec.schema_version == "1.2" and spec.cwd == RECORDED_CWD
    text = render_spec(spec)
    assert RelaunchSpec(**yaml.safe_load(text)) == spec
    assert f"# Command:  cd {RECORDED_CWD} && python dataloader_bound.py" in text
    assert "cwd" in json_schema()["properties"]


def test_a_1_1_spec_still_loads(tmp_path):
    old = tmp_path / "r.yaml"
    old.write_text('schema_version: "1.1"\njob: "j"\ncommand:\n  script: "t.py"\n  args: []\n')
    spec = load_spec(old)
    assert spec.cwd is None and spec.argv() == ["python", "t.py"]


def _relaunch(spec: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([sys.executable, "-m", "zoomer_ar", "relaunch", str(spec), *extra], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_relaunch_applies_and_runs_in_the_recorded_cwd(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "job.py").write_text("WORKERS = 0\nopen('ran.txt', 'w').write(str(WORKERS))\n")
    git_repo(repo)
    (tmp_path / "patch.diff").write_text("--- a/job.py\n+++ b/job.py\n@@ -1,2 +1,2 @@\n-WORKERS = 0\n+WORKERS = 4\n"
                                         " open('ran.txt', 'w').write(str(WORKERS))\n")
    spec = RelaunchSpec(job="j", command=Command(script="job.py"), cwd=str(repo), patch="patch.diff")
    (tmp_path / "relaunch.yaml").write_text(render_spec(spec))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dry = _relaunch(tmp_path / "relaunch.yaml", elsewhere, "--dry-run")
    assert dry.returncode == 0 and f"cd {repo}" in dry.stderr
    done = _relaunch(tmp_path / "relaunch.yaml", elsewhere)
    assert done.returncode == 0, done.stderr
    assert (repo / "ran.txt").read_text() == "4" and not (elsewhere / "ran.txt").exists()
    spec.cwd = str(tmp_path / "gone")
    (tmp_path / "relaunch.yaml").write_text(render_spec(spec))
    gone = _relaunch(tmp_path / "relaunch.yaml", elsewhere)
    assert gone.returncode == 2 and "not on this machine" in gone.stderr and "--cwd" in gone.stderr


def _multi(analysis: Analysis, folder: Path, world: int = 16, trace: Path | None = None) -> Analysis:
    job = analysis.job.model_copy(update={"world_size": world, "path": str(folder)})
    if trace is not None:
        job.ranks = [job.ranks[0].model_copy(update={"path": str(trace)})]
    return analysis.model_copy(update={"job": job})


def test_two_nodes_of_eight_from_local_world_size(dl_analysis, tmp_path):
    job = {"argv": ["train.py"], "cwd": "/w", "world_size": 16, "env": {"LOCAL_WORLD_SIZE": "8"}}
    spec = spec_from_analysis(_multi(dl_analysis, tmp_path), argv=["train.py"], job=job)
    assert (spec.command.nnodes, spec.command.nproc_per_node) == (2, 8)
    assert spec.argv()[:3] == ["torchrun", "--nnodes=2", "--nproc_per_node=8"]
    assert any("2 nodes with 8 processes" in n and "rendezvous" in n for n in spec.notes)


def test_layout_from_the_rank_records_hostnames(dl_analysis, tmp_path):
    (tmp_path / "job.ranks").mkdir()
    job = {"argv": ["train.py"], "cwd": "/w", "rank": 0, "hostname": "a"}
    (tmp_path / "job.json").write_text(json.dumps(job))
    for r in range(1, 16):
        (tmp_path / "job.ranks" / f"rank-{r}.json").write_text(json.dumps({"rank": r, "hostname": "ab"[r // 8]}))
    spec = spec_from_analysis(_multi(dl_analysis, tmp_path), argv=["train.py"])
    assert (spec.command.nnodes, spec.command.nproc_per_node) == (2, 8)


def test_layout_from_the_traces_distributed_info(dl_analysis, tmp_path):
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 16, "nnodes": 4},
                                 "traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}))
    spec = spec_from_analysis(_multi(dl_analysis, tmp_path, trace=trace), argv=["train.py"], job={"argv": ["train.py"]})
    assert (spec.command.nnodes, spec.command.nproc_per_node) == (4, 4)


def test_unknown_layout_is_said_not_guessed(dl_analysis, tmp_path):
    spec = spec_from_analysis(_multi(dl_analysis, tmp_path), argv=["train.py"], job={"argv": ["train.py"]})
    assert spec.command.nnodes is None and spec.command.nproc_per_node == 16
    assert any("spread over nodes is not known" in n and "command.nnodes" in n for n in spec.notes)
