"""Typed (pydantic) models passed between the pipeline stages.

load -> features -> detect -> fix -> render -> store. Each stage takes the previous stage's
typed output; nothing here imports a stage.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

ANALYSIS_SCHEMA_VERSION = "1.1"  # 1.1: `program` (the names that identify the profiled program)

PATTERN_IDS: tuple[str, ...] = (
    "idle-gpu",
    "launch-bound",
    "sync-point",
    "extra-copy",
    "pageable-memcpy",
    "dataloader-bound",
    "exposed-communication",
    "sharding-imbalance",
    "straggler",
    "allocator-churn",
    "fp32-matmul",
    "single-tensor-optimizer",
    "zero-grad-not-none",
    "conv-bias-before-bn",
    "memory-growth",
    "misaligned-gemm",
)

Severity = Literal["info", "low", "medium", "high", "critical"]
SEVERITY_ORDER: dict[str, int] = {"info": 0, "low": 1, "medium": 2, "high": 3, "critical": 4}


class RankInfo(BaseModel):
    """One rank's trace file."""

    path: str
    rank: int
    rank_source: Literal["distributedInfo", "file name", "default"]
    sha256: str
    size_bytes: int
    n_events: int
    trace_schema: Literal["2021", "current", "cpu-only", "unknown"] = "unknown"
    devices: list[str] = Field(default_factory=list)
    accelerator: Literal["nvidia", "amd", "mtia", "none", "unknown"] = "unknown"
    world_size: int | None = None
    backend: str | None = None


class SkippedFile(BaseModel):
    path: str
    reason: str


class JobInfo(BaseModel):
    """What was analysed."""

    name: str
    path: str
    ranks: list[RankInfo]
    skipped: list[SkippedFile] = Field(default_factory=list)
    world_size: int = 1


class SourceFrame(BaseModel):
    """A Python frame from the trace (`train.py(33): train_step`), optionally resolved to source."""

    file: str
    line: int
    function: str
    resolved_path: str | None = None
    resolved_line: int | None = None
    snippet: str | None = None


class EvidenceEvent(BaseModel):
    """One of the worst events behind a finding."""

    name: str
    rank: int = 0
    ts_ms: float
    dur_ms: float
    stream: int | None = None
    category: str = ""
    detail: str = ""
    frames: list[SourceFrame] = Field(default_factory=list)


class Impact(BaseModel):
    ms_per_step: float
    pct_of_step: float
    gpu_hours_per_1000_steps: float


class Evidence(BaseModel):
    figures: dict[str, bool | int | float | str | None] = Field(default_factory=dict)
    events: list[EvidenceEvent] = Field(default_factory=list)
    frames: list[SourceFrame] = Field(default_factory=list)


class ModelVote(BaseModel):
    probability: float
    threshold: float
    top_features: list[tuple[str, float]] = Field(default_factory=list)


class Finding(BaseModel):
    pattern: str
    title: str
    severity: Severity
    confidence: float = Field(ge=0.0, le=1.0)
    impact: Impact
    evidence: Evidence
    recommendation: str
    explanation: str = ""
    references: list[str] = Field(default_factory=list)
    fixers: list[str] = Field(default_factory=list)
    relaunch: dict[str, Any] = Field(default_factory=dict)
    detected_by: list[Literal["rules", "model"]] = Field(default_factory=lambda: ["rules"])
    model: ModelVote | None = None

    def all_frames(self) -> list[SourceFrame]:
        """The evidence's Python frames, then those of its worst events."""
        return [*self.evidence.frames, *(fr for e in self.evidence.events for fr in e.frames)]


class Bottleneck(BaseModel):
    type: Literal["input-bound", "host-bound", "compute-bound", "memory-bound", "communication-bound", "unknown"]
    shares: dict[str, float]
    summary: str


class TimelineBin(BaseModel):
    t_ms: float
    busy_pct: float


class ProgramSignature(BaseModel):
    """The names that identify the profiled program, all ranks together (program_match.py): `compare` warns when
    two runs share too few of them, a saved findings.json as well as a trace."""

    modules: list[str] = Field(default_factory=list)  # nn.Module classes (with_modules frames), wrappers left out
    kernel_families: list[str] = Field(default_factory=list)  # GPU kernels up to their template arguments
    operators: list[str] = Field(default_factory=list)  # CPU operators (aten::mm, ...)
    compiled: bool = False  # torch.compile regions, triton kernels or CUDA-graph replays seen


class Analysis(BaseModel):
    """The output of `analyze`: written as findings.json."""

    schema_version: str = ANALYSIS_SCHEMA_VERSION
    tool_version: str
    feature_schema_version: str
    job: JobInfo
    features: dict[str, Any]
    bottleneck: Bottleneck
    findings: list[Finding]
    timeline: list[TimelineBin] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    model_version: str | None = None  # the model version that voted on the findings; None: the rules alone
    # None: a job read in a streaming pass (its events are not kept) or a findings.json of schema 1.0
    program: ProgramSignature | None = None
