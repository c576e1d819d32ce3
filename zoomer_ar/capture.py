"""Capture helper: record a few steady-state training steps as a Kineto trace Zoomer AR can analyse.

Use it around an existing training loop::

    from zoomer_ar.capture import SteadyStateProfiler

    with SteadyStateProfiler("traces/run1", skip_first=550, warmup=2, active=5) as prof:
        for step, batch in enumerate(loader):
            train_step(batch)
            prof.step()              # one call per training step
            if prof.done:            # everything recorded: stop early if you like
                break

or hand it a step function::

    from zoomer_ar.capture import profile_steps

    profile_steps(lambda i: train_step(next(it)), out_dir="traces/run1", skip_first=20, active=5)

What is written to ``out_dir``:

* ``rank-{rank}.pt.trace.json.gz``: the Kineto trace of the recorded (active) steps, one file per
  rank. The rank comes from ``torch.distributed`` when it is initialised, else from the first of
  the ``RANK`` (torchrun), ``SLURM_PROCID``, ``OMPI_COMM_WORLD_RANK`` and ``PMI_RANK`` environment
  variables that is set, else 0 (a value that is not a rank is refused: pass ``rank=``). With
  ``repeat > 1`` later cycles go to
  ``cycle-{k}/rank-{rank}.pt.trace.json.gz`` (k = 1, 2, ...), the first cycle stays at the top.
* ``job.json``: metadata (job name, argv, torch version, hostname, schedule, recorded steps,
  profiler options). Rank 0 writes ``job.json``; other ranks write ``job.ranks/rank-{rank}.json``
  (a sub-folder, so a loader that reads every ``*.json`` in the folder as a trace never sees them)
  and ranks of one job never race on a file. It is written once the last recorded step's trace is
  (a job that trains on under the profiler and is killed later keeps it) and again when the
  profiler stops (the steps the loop ran in all); a run that fails before that writes none.

A trace is exported uncompressed next to where it goes (a hidden ``.rank-{rank}.pt.trace.json.gz.*``
file, removed once it is gzipped or the export fails), never into the system temp folder: a GPU
trace's export runs to gigabytes, and ``out_dir`` needs that room for a moment. A capture killed
mid-export (SIGKILL, the OOM killer) cannot remove its temporary; the next capture of that rank into
the folder removes it (with a ``RuntimeWarning`` naming it) once its writer is gone and it is old: a
minute when it names a process of this host that no longer runs, else 6 hours. Each writer holds an
``flock`` on its temporary and names it with its pid and host
(``.rank-0.pt.trace.json.gz.zoomer-{pid}@{host}.*``), so one a running process holds is never
touched (:mod:`zoomer_ar.capture_temp`).

The folder is checked when the profiler starts, before the loop runs: one that cannot be created
or written to, or that already holds this rank's capture from an earlier run, raises
:class:`CaptureError` (``overwrite=True`` replaces that rank's earlier trace files and job file, so
two runs never mix in one folder, once the new run has written its first trace: a run that fails or
stops before that keeps them, and writes no job file over theirs). Bad schedule arguments raise ``TypeError``/``ValueError`` at
construction. A loop that stops before the first recorded step (a schedule longer than the run)
writes no trace and warns (``RuntimeWarning``); ``job.json`` says ``complete: false``.

The traces keep the ``ProfilerStep#N`` annotations (they come from ``prof.step()``), python frames
(``with_stack``), ``nn.Module`` frames (``with_modules``), input shapes (``record_shapes``) and, when
asked, ``[memory]`` events (``profile_memory``).

torch is imported inside the functions only: the engine imports this module without torch.
"""

from __future__ import annotations

import gzip
import json
import numbers
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .capture_temp import held_temp, remove_stale

__all__ = [
    "CAPTURE_SCHEMA",
    "CaptureError",
    "CaptureResult",
    "SteadyStateProfiler",
    "detect_rank",
    "profile_steps",
    "trace_file_name",
]

CAPTURE_SCHEMA = "zoomer-ar.capture/1"
#: torch.profiler's warning when a second cycle starts without acc_events ("Only events from the current
#: cycle will be reported"): true of one exported trace, misleading here, where every cycle has its file
_CYCLE_CLEARS_WARNING = r"Warning: Profiler clears events at the end of each cycle"
DEFAULT_SKIP_FIRST = 550  # what Zoomer uses on real jobs: well past compile/cache warm-up


#: environment variables that carry a process's rank, in the order they are read: torchrun's,
#: then those of SLURM, Open MPI and MPICH/PMI launchers (a job started without torchrun)
RANK_ENV_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


class CaptureError(RuntimeError):
    """The output folder cannot take the capture: it cannot be created or written to, or it already
    holds this rank's capture from an earlier run (``overwrite=True`` replaces it)."""


def trace_file_name(rank: int) -> str:
    return f"rank-{rank}.pt.trace.json.gz"


def _count(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= minimum; a bool, float, string or None is a TypeError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {minimum}, not {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value}")
    return int(value)


def _dist_info() -> tuple[int | None, int | None, str | None]:
    """(rank, world_size, backend) from torch.distributed, or Nones when it is not initialised."""
    try:
        import torch.distributed as dist
    except Exception:  # pragma: no cover - torch without distributed
        return None, None, None
    try:
        if dist.is_available() and dist.is_initialized():
            backend = None
            try:
                backend = str(dist.get_backend())
            except Exception:  # pragma: no cover
                pass
            return dist.get_rank(), dist.get_world_size(), backend
    except Exception:  # pragma: no cover
        pass
    return None, None, None


def detect_rank(rank: int | None = None) -> tuple[int, str]:
    """The rank to name the trace after, and where it came from ('argument', 'torch.distributed',
    'env RANK' (or the launcher variable it came from, :data:`RANK_ENV_VARS`) or 'default').

    A variable that is set but holds no rank (``RANK=-1``, ``RANK=abc``) is a ValueError: guessing 0
    would have every rank of the job write the same file."""
    if rank is not None:
        return _count("rank", rank, 0), "argument"
    dist_rank, _, _ = _dist_info()
    if dist_rank is not None:
        return int(dist_rank), "torch.distributed"
    for var in RANK_ENV_VARS:
        env = os.environ.get(var, "").strip()
        if not env:
            continue
        if not (env.isascii() and env.isdigit()):
            raise ValueError(f"{var}={os.environ[var]!r} in the environment is not a rank (an integer >= 0): "
                             "pass rank= to name the trace")
        return int(env), f"env {var}"
    return 0, "default"


#: the trace's gzip level: the export and its compression run inside prof.step(), holding up the training
#: loop (and its GPUs) on every rank. hta/trace_diff's control trace (35 MB of JSON): level 9 took 2.7 s
#: for 1.57 MB, level 6 0.54 s for 1.77 MB (13% more), so a 2 GB export waits about 30 s, not 150 s
GZIP_LEVEL = 6


def _gzip_file(src: Path, dst: Path) -> None:
    """Gzip src into dst atomically, with a fixed header (mtime 0) so equal traces give equal bytes; the
    half-written file is a held temporary (capture_temp), removed on every path a process survives."""
    with held_temp(dst, ".gz.tmp") as tmp:
        with open(src, "rb") as fin, open(tmp, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL, mtime=0) as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        os.replace(tmp, dst)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with held_temp(path, ".json.tmp") as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)


#: /proc/cpuinfo flags that mean bf16 matmuls run natively (x86: AVX512_BF16, AMX; Arm: BF16)
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_facts(cpuinfo: str | None = None) -> dict:
    """The CPU's model and whether it runs bf16 natively, from /proc/cpuinfo (``{}`` elsewhere).

    analyze reads ``native_bf16`` to decide whether the opt-in cpu-autocast fix goes into the
    patch: without native bf16 the bf16 GEMMs are emulated and slower than float32."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                cpuinfo = fh.read(1 << 20)
        except OSError:
            return {}
    model, flags = "", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    if not flags:
        return {"model": model} if model else {}
    return {"model": model, "native_bf16": any(f in flags for f in BF16_FLAGS),
            "bf16_flags": sorted(f for f in flags if f in BF16_FLAGS)}


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class CaptureResult:
    """What a capture wrote."""

    out_dir: Path
    rank: int
    traces: list[Path] = field(default_factory=list)
    job_json: Path | None = None
    steps_run: int = 0
    steps_recorded: list[int] = field(default_factory=list)


class SteadyStateProfiler:
    """torch.profiler.profile with a schedule that records a few steps once training is steady.

    Schedule (in calls to :meth:`step`): ``skip_first`` steps are ignored, then per cycle ``wait``
    idle steps, ``warmup`` steps traced but discarded, ``active`` steps recorded; ``repeat`` cycles.
    ``total_steps`` is how many steps the loop must run for everything to be recorded.
    ``overwrite=True`` replaces this rank's capture from an earlier run in ``out_dir`` (without it
    :meth:`start` raises :class:`CaptureError`) once this run writes its first trace: a run that fails
    or stops before that leaves the earlier capture as it was. ``enabled=False`` switches the capture
    off (for the runs or ranks that should not be profiled: ``enabled=rank == 0``): the loop runs as it
    would without the helper, :meth:`step` and :attr:`done` still count steps, and ``out_dir`` is neither made, checked
    nor written (the result lists no trace and no job file).
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        skip_first: int = DEFAULT_SKIP_FIRST,
        wait: int = 0,
        warmup: int = 2,
        active: int = 5,
        repeat: int = 1,
        rank: int | None = None,
        job_name: str | None = None,
        with_stack: bool = True,
        record_shapes: bool = True,
        profile_memory: bool = False,
        with_modules: bool = True,
        with_flops: bool = False,
        metadata: dict[str, Any] | None = None,
        enabled: bool = True,
        overwrite: bool = False,
    ) -> None:
        self.active = _count("active", active, 1)
        if isinstance(repeat, numbers.Integral) and not isinstance(repeat, bool) and repeat < 1:
            raise ValueError("repeat must be >= 1 (0 = unlimited is not supported: one file per cycle)")
        self.repeat = _count("repeat", repeat, 1)
        self.skip_first = _count("skip_first", skip_first, 0)
        self.wait = _count("wait", wait, 0)
        self.warmup = _count("warmup", warmup, 0)
        if rank is not None:
            _count("rank", rank, 0)
        self.out_dir = Path(out_dir)
        self.job_name = job_name or Path(sys.argv[0] or "python").stem or "job"
        self.with_stack = with_stack
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_modules = with_modules
        self.with_flops = with_flops
        self.metadata = dict(metadata or {})
        self.enabled = enabled
        self.overwrite = overwrite
        self._rank_arg = rank
        self.rank = 0
        self.rank_source = "default"
        self.steps_run = 0
        self.traces: list[Path] = []
        self._cycles_written = 0
        self._replaced: list[Path] = []  # overwrite=True: the earlier run's files, removed once a new trace is written
        self._prof: Any = None
        self._started_at: str | None = None
        self._t0 = 0.0
        self.result: CaptureResult | None = None

    # -- schedule arithmetic -------------------------------------------------------------------
    @property
    def cycle_len(self) -> int:
        return self.wait + self.warmup + self.active

    @property
    def total_steps(self) -> int:
        """Calls to step() needed for every cycle to be recorded."""
        return self.skip_first + self.cycle_len * self.repeat

    def recorded_steps(self, cycle: int | None = None) -> list[int]:
        """Step numbers (as in ``ProfilerStep#N``) recorded by one cycle, or by all cycles."""
        cycles = range(self.repeat) if cycle is None else [cycle]
        out: list[int] = []
        for c in cycles:
            first = self.skip_first + c * self.cycle_len + self.wait + self.warmup
            out.extend(range(first, first + self.active))
        return out

    @property
    def done(self) -> bool:
        """True once every cycle has been recorded (the loop may stop)."""
        return self.steps_run >= self.total_steps

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> SteadyStateProfiler:
        self._started_at = _utc_now()
        self._t0 = time.perf_counter()
        if not self.enabled:  # a switched-off capture touches nothing: no folder, no check, no file
            self.rank, self.rank_source = (self._rank_arg, "argument") if self._rank_arg is not None else (0, "disabled")
            return self
        self.rank, self.rank_source = detect_rank(self._rank_arg)
        self._prepare_out_dir()  # before torch is imported, before the loop runs

        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        self._started_at = _utc_now()
        self._t0 = time.perf_counter()
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(
            activities=activities,
            schedule=schedule(
                skip_first=self.skip_first,
                wait=self.wait,
                warmup=self.warmup,
                active=self.active,
                repeat=self.repeat,
            ),
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_modules=self.with_modules,
            with_flops=self.with_flops,
        )
        self._prof.start()
        return self

    def _own_outputs(self) -> list[Path]:
        """This rank's files in out_dir: its traces (every cycle) and its job file."""
        name = trace_file_name(self.rank)
        found = [self.out_dir / name] + sorted(self.out_dir.glob(f"cycle-*/{name}"))
        found.append(self._job_path())
        return [p for p in found if p.exists()]

    def _prepare_out_dir(self) -> None:
        """Before the loop runs: the folder exists, can be written to, and holds no earlier capture
        of this rank (or, with overwrite, no longer does)."""
        out = self.out_dir
        try:
            out.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise CaptureError(f"{out}: exists and is not a folder: choose another out_dir") from None
        except OSError as e:
            raise CaptureError(f"{out}: cannot create the output folder ({e.strerror or e})") from None
        try:
            fd, probe = tempfile.mkstemp(prefix=".zoomer-write-check-", dir=out)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise CaptureError(f"{out}: cannot write the trace here ({e.strerror or e}): choose a writable out_dir") from None
        earlier = self._own_outputs()
        if earlier and not self.overwrite:
            shown = ", ".join(str(p.relative_to(out)) for p in earlier[:3])
            raise CaptureError(f"{out}: already holds a capture of rank {self.rank} ({shown}): "
                               "pass overwrite=True to replace it, or choose another out_dir")
        self._replaced = earlier  # kept until this run writes its first trace: a run that fails before keeps them
        self._remove_stale_temporaries()

    def _remove_stale_temporaries(self) -> None:
        """Remove what an earlier capture of this rank left when it was killed mid-export (its hidden
        temporaries: gigabytes for a GPU trace), once they are old and their writer is gone
        (capture_temp.remove_stale); another process's temporary in use is never touched."""
        name, job = trace_file_name(self.rank), self._job_path()
        folders = [(self.out_dir, [name] + ([job.name] if job.parent == self.out_dir else []))]
        folders += [(d, [name]) for d in sorted(self.out_dir.glob("cycle-*")) if d.is_dir()]
        if job.parent != self.out_dir:
            folders.append((job.parent, [job.name]))
        removed = [p for folder, names in folders for p in remove_stale(folder, names)]
        if removed:
            shown = ", ".join(str(p.relative_to(self.out_dir)) for p in removed[:3])
            more = f" and {len(removed) - 3} more" if len(removed) > 3 else ""
            warnings.warn(f"zoomer_ar.capture: removed {len(removed)} temporary file(s) an earlier capture of rank "
                          f"{self.rank} left in {self.out_dir} when it was stopped mid-write: {shown}{more}",
                          RuntimeWarning, stacklevel=4)

    def step(self) -> None:
        """Mark the end of one training step (calls ``prof.step()``)."""
        self.steps_run += 1
        if self._prof is None:
            return
        if self.repeat == 1:
            self._prof.step()
            return
        with warnings.catch_warnings():  # each cycle is its own file here: nothing is lost, whatever torch says
            warnings.filterwarnings("ignore", message=_CYCLE_CLEARS_WARNING, category=UserWarning)
            self._prof.step()

    def stop(self) -> CaptureResult:
        if self._prof is not None:
            prof, self._prof = self._prof, None
            prof.stop()
        if self.enabled and not self.traces:
            first = self.recorded_steps(0)[0]
            kept = (f"; the earlier capture there is kept ({', '.join(str(p.relative_to(self.out_dir)) for p in self._replaced[:3])})"
                    if self._replaced else "")
            warnings.warn(
                f"zoomer_ar.capture: no step recorded in {self.out_dir}: the loop ran {self.steps_run} step(s) and "
                f"stopped before step {first}, the first the schedule records (skip_first {self.skip_first} + "
                f"wait {self.wait} + warmup {self.warmup}); lower skip_first or run the loop for {self.total_steps} steps"
                f"{kept}", RuntimeWarning, stacklevel=2)
        return self._finish()

    def __enter__(self) -> SteadyStateProfiler:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None and self._prof is not None:
            prof, self._prof = self._prof, None
            try:
                prof.stop()
            except Exception:  # pragma: no cover - keep the user's exception
                pass
            return
        self.stop()

    # -- output --------------------------------------------------------------------------------
    def _job_path(self) -> Path:
        return _job_path_for(self.out_dir, self.rank)

    def _trace_path(self, cycle: int) -> Path:
        folder = self.out_dir if cycle == 0 else self.out_dir / f"cycle-{cycle}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / trace_file_name(self.rank)

    def _on_trace_ready(self, prof: Any) -> None:
        """Export the trace beside its destination (a hidden file, removed on every path), then gzip
        it: the uncompressed export of a GPU trace runs to gigabytes, which the system temp folder (a
        small /tmp) may not hold, while out_dir was checked writable and is where the trace goes."""
        dst = self._trace_path(self._cycles_written)
        with held_temp(dst, ".json.tmp") as tmp:
            prof.export_chrome_trace(str(tmp))
            _gzip_file(tmp, dst)
        self._remove_replaced(keep=dst)
        self.traces.append(dst)
        self._cycles_written += 1
        if self._cycles_written >= self.repeat and self.steps_run >= self.total_steps:
            # everything is recorded (not a partial window flushed as a failed loop stops): job.json now,
            # not only when the block ends - a loop that trains on for hours under it and is then killed
            # (SIGTERM at the end of a SLURM allocation, the OOM killer) keeps it (relaunch replays its
            # command); the block's end writes it again, final
            self._finish()

    def _remove_replaced(self, keep: Path) -> None:
        """overwrite=True: the earlier run's files go once this run's first trace is written (``keep``, its
        destination, has just replaced its namesake in one rename), so one folder never mixes two runs."""
        replaced, self._replaced = self._replaced, []
        for p in replaced:
            if p != keep:
                p.unlink(missing_ok=True)

    def _finish(self) -> CaptureResult:
        if not self.enabled or (not self.traces and self._replaced):
            # switched off, or nothing recorded where an earlier capture is kept (its job file describes it)
            self.result = CaptureResult(out_dir=self.out_dir, rank=self.rank, steps_run=self.steps_run)
            return self.result
        import torch

        _, world_size, backend = _dist_info()
        if world_size is None and os.environ.get("WORLD_SIZE", "").isdigit():
            world_size = int(os.environ["WORLD_SIZE"])
        recorded = [s for c in range(self._cycles_written) for s in self.recorded_steps(c)]
        # A loop that stopped inside an active window still gets its partial cycle flushed.
        recorded = [s for s in recorded if s < self.steps_run] or recorded
        job = {
            "schema": CAPTURE_SCHEMA,
            "job_name": self.job_name,
            "argv": list(sys.argv),
            "executable": sys.executable,  # the interpreter the job ran on: a relaunch runs the same one
            "module": _main_module(),  # `python -m NAME`: sys.argv[0] is then the module's file
            "cwd": os.getcwd(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "torch_version": torch.__version__,
            "cuda_available": bool(torch.cuda.is_available()),
            "cuda_version": torch.version.cuda,
            "num_threads": torch.get_num_threads(),
            "cpu": cpu_facts(),
            "rank": self.rank,
            "rank_source": self.rank_source,
            "world_size": world_size,
            "backend": backend,
            "started_at": self._started_at,
            "finished_at": _utc_now(),
            "wall_s": round(time.perf_counter() - self._t0, 3),
            "schedule": {
                "skip_first": self.skip_first,
                "wait": self.wait,
                "warmup": self.warmup,
                "active": self.active,
                "repeat": self.repeat,
            },
            "steps_run": self.steps_run,
            "steps_recorded": recorded,
            "complete": self._cycles_written >= self.repeat and self.steps_run >= self.total_steps,
            "profiler": {
                "enabled": self.enabled,
                "with_stack": self.with_stack,
                "record_shapes": self.record_shapes,
                "profile_memory": self.profile_memory,
                "with_modules": self.with_modules,
                "with_flops": self.with_flops,
            },
            "traces": [str(p.relative_to(self.out_dir)) for p in self.traces],
            "metadata": self.metadata,
        }
        job_path = self._job_path()
        job_path.parent.mkdir(parents=True, exist_ok=True)
        _write_json(job_path, job)
        self.result = CaptureResult(
            out_dir=self.out_dir,
            rank=self.rank,
            traces=list(self.traces),
            job_json=job_path,
            steps_run=self.steps_run,
            steps_recorded=recorded,
        )
        return self.result


def _job_path_for(out_dir: Path, rank: int) -> Path:
    """Rank 0 writes job.json; other ranks a file of their own in job.ranks/ (no race on one file)."""
    return out_dir / "job.json" if rank == 0 else out_dir / "job.ranks" / f"rank-{rank}.json"


def _main_module() -> str | None:
    """The module the job was started as (``python -m pkg.train`` gives ``pkg.train``; a package
    run as ``python -m pkg`` gives ``pkg``), or None for a script."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None)
    if not isinstance(name, str) or not name:
        return None
    return name[: -len(".__main__")] if name.endswith(".__main__") else name


def profile_steps(
    step_fn: Callable[[int], Any],
    *,
    out_dir: str | os.PathLike[str],
    steps: int | None = None,
    skip_first: int = 0,
    wait: int = 0,
    warmup: int = 1,
    active: int = 3,
    repeat: int = 1,
    rank: int | None = None,
    job_name: str | None = None,
    with_stack: bool = True,
    record_shapes: bool = True,
    profile_memory: bool = False,
    with_modules: bool = True,
    metadata: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> CaptureResult:
    """Call ``step_fn(i)`` for ``steps`` steps (default: just enough to record everything) under a
    :class:`SteadyStateProfiler`; returns what was written."""
    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable (called with the step number), not {step_fn!r}")
    prof = SteadyStateProfiler(
        out_dir,
        skip_first=skip_first,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        rank=rank,
        job_name=job_name,
        with_stack=with_stack,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_modules=with_modules,
        metadata=metadata,
        overwrite=overwrite,
    )
    n = prof.total_steps if steps is None else _count("steps", steps, 0)
    if n < prof.total_steps:
        raise ValueError(
            f"steps={n} is too few for the schedule: it needs {prof.total_steps} "
            f"(skip_first {skip_first} + (wait {wait} + warmup {warmup} + active {active}) x repeat {repeat})"
        )
    with prof:
        for i in range(n):
            step_fn(i)
            prof.step()
    assert prof.result is not None
    return prof.result
