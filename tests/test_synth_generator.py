"""The trace generator as a user drives it (`zoomer-ar corpus sample`, `synth.generator.generate`):
odd seeds, forced patterns, a folder used twice; every output a valid trace, the same bytes for a
seed, and a planted pattern that the generator labels positive one that `analyze` can find."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from zoomer_ar.cli import main
from zoomer_ar.synth.generator import CONV_NAMES, GEMM_PLANTS, MULTI_RANK, TRAIN_ONLY, SpecError, generate, sample_spec

SEEDS = range(0, 40)


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_sampled_jobs_are_valid_traces_and_the_same_for_a_seed(tmp_path, capsys):
    """One rank, eight ranks, no ProfilerStep (0 steps) and a seed past 64 bits: each sample passes
    `trace check` and a second sample of the seed is byte for byte the first."""
    shapes = {}
    for seed in (2, 3, 29, 2**70 + 1):
        spec = sample_spec(seed)
        shapes[seed] = (len(spec.emit_ranks), spec.steps)
        a, b = tmp_path / f"{seed}-a", tmp_path / f"{seed}-b"
        assert main(["corpus", "sample", str(seed), "--out", str(a)]) == 0
        assert main(["corpus", "sample", str(seed), "--out", str(b)]) == 0
        assert _files(a) == _files(b)
        assert main(["trace", "check", str(a)]) == 0
        out = capsys.readouterr().out
        assert out.count(": valid (") == len(spec.emit_ranks)
    assert {n for n, _ in shapes.values()} >= {1, 8} and 0 in {s for _, s in shapes.values()}


@pytest.mark.parametrize("seed", ["-1", "-5"])
def test_a_negative_seed_is_one_line_exit_2(tmp_path, capsys, seed):
    """`corpus sample -- -1` was 'internal error: ValueError: expected non-negative integer', exit 1."""
    assert main(["corpus", "sample", "--out", str(tmp_path / "o"), "--", seed]) == 2
    err = capsys.readouterr().err
    assert f"seed must be an integer >= 0, not {seed}" in err and "internal error" not in err
    assert len(err.strip().splitlines()) == 1


def test_the_api_refuses_what_it_cannot_plant():
    """An unknown pattern was planted silently (spec.planted ['nope'], no label); a bool or negative
    seed reached numpy."""
    with pytest.raises(SpecError, match="cannot plant nope: the generator plants "):
        generate(0, ["nope"])
    with pytest.raises(SpecError, match="conv-bias-before-bn needs a CNN and fp32-matmul a model with matmuls"):
        generate(0, ["conv-bias-before-bn", "fp32-matmul"])
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(ValueError, match="seed must be an integer >= 0"):
            sample_spec(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("pattern", sorted(MULTI_RANK + TRAIN_ONLY + GEMM_PLANTS + ("conv-bias-before-bn",)))
def test_a_forced_pattern_gets_a_job_that_can_show_it(pattern):
    """`--plant straggler` drew single-rank jobs (and inference jobs, which run no optimizer or
    backward), `--plant fp32-matmul` CNNs without a matmul, `--plant conv-bias-before-bn` MLPs
    without a convolution: the pattern was 'planted' and could not be there."""
    for seed in SEEDS:
        s = sample_spec(seed, [pattern])
        assert s.planted == [pattern]
        if pattern in MULTI_RANK:
            assert s.world > 1 and s.mode == "train"
        if pattern in ("straggler", "sharding-imbalance"):
            assert s.emit_ranks == list(range(s.world))
        if pattern in TRAIN_ONLY:
            assert s.mode == "train"
        if pattern == "memory-growth":
            assert s.steps >= 3
        if pattern in GEMM_PLANTS:
            assert s.arch != "cnn"
        if pattern == "conv-bias-before-bn":
            assert s.arch == "cnn"


def test_unforced_jobs_plant_gemm_patterns_only_where_there_are_matmuls():
    for seed in range(300):
        s = sample_spec(seed)
        if s.arch == "cnn":
            assert not set(s.planted) & set(GEMM_PLANTS), seed


def test_fp32_matmul_slows_matmuls_not_convolutions():
    """The fp32-matmul plant ran a CNN's convolutions as FP32 cuDNN kernels and labelled the cost
    fp32-matmul positive; analyze (rightly: cuDNN's precision is cudnn.allow_tf32's, not the matmul
    precision's) never counts convolutions as matmuls, so it 'missed' every such job."""
    for seed in SEEDS:
        g = generate(seed)
        if g.spec.arch == "cnn":
            names = {e.get("name") for d in g.documents for e in d["traceEvents"] if e.get("cat") == "kernel"}
            assert CONV_NAMES["fp32"] not in names, seed


def test_analyze_finds_fp32_matmul_where_the_generator_labels_it_positive():
    from zoomer_ar.analyze import analyze_path
    from zoomer_ar.synth.documents import write_documents

    import tempfile

    checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(150):
            g = generate(seed)
            if g.labels["fp32-matmul"] != "positive":
                continue
            folder = Path(tmp) / str(seed)
            write_documents(g.documents, folder)
            found = {f.pattern for f in analyze_path(folder).findings}
            assert "fp32-matmul" in found, (seed, g.spec.arch, g.costs["fp32-matmul"])
            checked += 1
    assert checked >= 5


def test_a_second_sample_into_the_same_folder_is_refused(tmp_path, capsys):
    """Seed 2 (8 ranks) then seed 1 (2 ranks) into one folder left 8 rank files, 6 of them the first
    job's, that `analyze` read as one 8-rank job labelled by the second job's labels.yaml."""
    out = tmp_path / "job"
    assert main(["corpus", "sample", "2", "--out", str(out)]) == 0
    before = _files(out)
    capsys.readouterr()
    assert main(["corpus", "sample", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out}: already holds trace files (rank-0.json, rank-1.json, rank-2.json and 5 more): write the " \
           "generated job to a new or empty folder" in err
    assert _files(out) == before


def test_a_rank_lagging_by_its_kernel_launches_is_labelled_a_straggler():
    """Every multi-rank job draws each rank's launch latency; a rank whose kernels reach its GPU 0.3 ms later
    than the median rank's is waited for at every collective. Seed 3's planted host delay (another rank's) is
    hidden behind that lag and costs nothing, and generator version 2 labelled the job by it alone: negative.
    The straggler's counterfactual now brings the lagging rank to the median too: 8.8% of the wall time."""
    from zoomer_ar.synth.generator import JobModel, job_wall

    g = generate(3, ["straggler"])
    assert g.truth["rank_lag_us"] > 250
    model = JobModel(g.spec)
    model.calibrate()
    wall = job_wall(model.simulate())
    assert job_wall(model.simulate(off=frozenset({"straggler"}))) == pytest.approx(wall)  # the plant alone: nothing
    assert g.costs["straggler"] >= 5.0 and g.labels["straggler"] == "positive"
