"""Rule files (`rules/<id>.yaml`): schema, validation and loading.

A rule is data: when it applies, the condition over features, the impact formula (avoidable GPU
time per step, ms), how sure it is, what to show as evidence, what to recommend, which fixers and
relaunch settings it maps to, and VALID/INVALID feature examples that become tests.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import RuleError
from ..features.schema import FeatureVector
from ..models import PATTERN_IDS, Severity
from ..paths import RULES_DIR
from .expr import Expr, ExprError

# Names a rule expression may read besides the features.
DERIVED_NAMES = {"impact_ms", "impact_pct"}
FEATURE_NAMES = set(FeatureVector.model_fields)


class RuleExample(BaseModel):
    """Features (partial; the rest take FeatureVector defaults) and what the rule must do on them."""

    model_config = ConfigDict(extra="forbid")
    note: str = ""
    features: dict[str, Any]
    impact_pct: float | None = None  # for INVALID examples: expected impact, +-1 point

    @field_validator("features")
    @classmethod
    def _known(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(v) - FEATURE_NAMES)
        if unknown:
            raise ValueError(f"unknown feature(s) {unknown}")
        return v


class SeverityBands(BaseModel):
    """impact_pct thresholds: the highest band reached gives the severity."""

    model_config = ConfigDict(extra="forbid")
    critical: float = 25.0
    high: float = 10.0
    medium: float = 5.0
    low: float = 1.0


class Fix(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fixers: list[str] = Field(default_factory=list)
    relaunch: dict[str, Any] = Field(default_factory=dict)
    # the fixers and relaunch settings help only where this holds over the features (e.g. a TF32 setting
    # needs a GPU with TF32); elsewhere the finding stands with its recommendation and `unless` as a note
    when: str = "True"
    unless: str = ""


class HardwareText(BaseModel):
    """A rule's wording for one kind of trace, where its own (CUDA GPU) wording would name hardware or
    APIs the job did not use: `on_cpu` for a CPU-only trace (no device, none listed: "drain the GPU
    queue", "tensor cores"), `on_rocm` for an AMD GPU's (HIP runtime: hipMalloc, not cudaMalloc;
    PyTorch's ROCm build keeps the torch.cuda names). A field left out keeps the rule's own text;
    `unless` stands for `fix.unless`."""

    model_config = ConfigDict(extra="forbid")
    title: str | None = None
    explanation: str | None = None
    recommendation: str | None = None
    unless: str | None = None


class RuleText(NamedTuple):
    """A rule's words for one trace (Rule.text_for)."""

    title: str
    explanation: str
    recommendation: str
    unless: str


def cpu_only(features: dict[str, Any]) -> bool:
    """The trace shows no device and lists none: a CPU job (a GPU job profiled without its device
    activity, `device_not_recorded`, still ran on a GPU)."""
    return not (features.get("has_accelerator") or features.get("device_not_recorded"))


def rocm(features: dict[str, Any]) -> bool:
    """The trace's GPU runs the HIP runtime: an AMD device, or hip* runtime calls beside GPU events
    (the loader's `accelerator`, "amd")."""
    return features.get("accelerator") == "amd" and not cpu_only(features)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    id: str
    title: str
    category: Literal["utilisation", "host", "input", "memory-traffic", "communication", "distributed", "allocator",
                      "operators", "optimizer", "memory"]
    summary: str
    applies_when: str = "True"
    condition: str
    impact_ms: str
    confidence: str = "0.8"
    min_severity: Severity = "low"
    fixed_severity: Severity | None = None
    severity_bands: SeverityBands = Field(default_factory=SeverityBands)
    evidence: list[str] = Field(default_factory=list)
    figures: list[str] = Field(default_factory=list)
    explanation: str
    example: str = ""
    recommendation: str
    fix: Fix = Field(default_factory=Fix)
    on_cpu: HardwareText = Field(default_factory=HardwareText)
    on_rocm: HardwareText = Field(default_factory=HardwareText)
    references: list[str] = Field(default_factory=list)
    # the pattern whose impact already contains this one's (its time is a part of that time):
    # combined totals (zoomer_ar.detect.combine) count the two once
    within: str | None = None
    valid: list[RuleExample] = Field(default_factory=list)
    invalid: list[RuleExample] = Field(default_factory=list)

    # parsed expressions (not part of the file format)
    _applies: Expr
    _condition: Expr
    _impact: Expr
    _confidence: Expr
    _fix_when: Expr

    @field_validator("id")
    @classmethod
    def _id_known(cls, v: str) -> str:
        if v not in PATTERN_IDS:
            raise ValueError(f"{v!r} is not an anti-pattern id ({', '.join(PATTERN_IDS)})")
        return v

    @field_validator("within")
    @classmethod
    def _within_known(cls, v: str | None) -> str | None:
        if v is not None and v not in PATTERN_IDS:
            raise ValueError(f"{v!r} is not an anti-pattern id")
        return v

    @field_validator("figures")
    @classmethod
    def _figures_known(cls, v: list[str]) -> list[str]:
        unknown = sorted(set(v) - FEATURE_NAMES)
        if unknown:
            raise ValueError(f"unknown feature(s) in figures: {unknown}")
        return v

    @model_validator(mode="after")
    def _parse(self) -> "Rule":
        if self.within == self.id:
            raise ValueError("within: a rule cannot be within itself")
        if not self.valid or not self.invalid:
            raise ValueError("a rule needs at least one VALID and one INVALID example")
        parsed = {}
        for field_name in ("applies_when", "condition", "impact_ms", "confidence"):
            try:
                e = Expr(getattr(self, field_name))
            except ExprError as exc:
                raise ValueError(f"{field_name}: {exc}") from None
            allowed = FEATURE_NAMES | (DERIVED_NAMES if field_name in ("condition", "confidence") else set())
            unknown = sorted(e.names - allowed)
            if unknown:
                raise ValueError(f"{field_name}: unknown name(s) {unknown}")
            parsed[field_name] = e
        try:
            fix_when = Expr(self.fix.when)
        except ExprError as exc:
            raise ValueError(f"fix.when: {exc}") from None
        unknown = sorted(fix_when.names - FEATURE_NAMES)
        if unknown:
            raise ValueError(f"fix.when: unknown name(s) {unknown}")
        self._fix_when = fix_when
        self._applies = parsed["applies_when"]
        self._condition = parsed["condition"]
        self._impact = parsed["impact_ms"]
        self._confidence = parsed["confidence"]
        return self

    # --- evaluation -------------------------------------------------------------------------------
    def evaluate(self, features: dict[str, Any]) -> dict[str, Any] | None:
        """Returns {'impact_ms', 'impact_pct', 'confidence'} when the rule fires, else None."""
        if not self._applies(features):
            return None
        impact_ms = self._impact(features)
        impact_ms = max(0.0, float(impact_ms)) if impact_ms is not None else 0.0
        step = features.get("step_ms") or 0.0
        if step > 0:  # no fix saves more than the whole step (idle over a GPU span wider than the steps can)
            impact_ms = min(impact_ms, step)
        impact_pct = 100.0 * impact_ms / step if step > 0 else 0.0
        env = dict(features, impact_ms=impact_ms, impact_pct=impact_pct)
        if not self._condition(env):
            return None
        conf = self._confidence(env)
        conf = 0.5 if conf is None else max(0.0, min(1.0, float(conf)))
        return {"impact_ms": impact_ms, "impact_pct": impact_pct, "confidence": conf}

    def text_for(self, features: dict[str, Any]) -> RuleText:
        """The finding's words for the trace's hardware: `on_cpu`'s where the trace is CPU-only,
        `on_rocm`'s where its GPU runs HIP, the rule's own elsewhere (a field left out: the own)."""
        own = self.on_cpu if cpu_only(features) else self.on_rocm if rocm(features) else HardwareText()
        return RuleText(own.title or self.title, own.explanation or self.explanation,
                        own.recommendation or self.recommendation, own.unless or self.fix.unless)

    def fix_applies(self, features: dict[str, Any]) -> bool:
        """Do this rule's fixers and relaunch settings help on this job (`fix.when`)?"""
        return bool(self._fix_when(features))

    def severity_for(self, impact_pct: float) -> Severity:
        if self.fixed_severity:
            return self.fixed_severity
        order = ["info", "low", "medium", "high", "critical"]
        sev = "info"
        b = self.severity_bands
        for name, threshold in (("low", b.low), ("medium", b.medium), ("high", b.high), ("critical", b.critical)):
            if impact_pct >= threshold:
                sev = name
        if order.index(sev) < order.index(self.min_severity):
            sev = self.min_severity
        return sev  # type: ignore[return-value]


def example_features(example: RuleExample) -> dict[str, Any]:
    """A full feature dict: FeatureVector defaults overlaid with the example's figures."""
    return FeatureVector(**example.features).model_dump()


# libyaml's loader where PyYAML was built with it (the wheels are): the same documents as SafeLoader
# (tests/test_rules_catalogue.py), read 7x faster - the rule files are read on every analysis
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_rule(path: Path) -> Rule:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER)  # noqa: S506 - a safe loader
    except (OSError, yaml.YAMLError) as exc:
        raise RuleError(f"rule file {path.name}: cannot read YAML ({exc})") from None
    if not isinstance(data, dict):
        raise RuleError(f"rule file {path.name}: expected a mapping at the top level")
    try:
        rule = Rule(**data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise RuleError(f"rule file {path.name}: {loc + ': ' if loc else ''}{first.get('msg')}") from None
    if path.stem != rule.id:
        raise RuleError(f"rule file {path.name}: id {rule.id!r} does not match the file name")
    return rule


def load_rules(directory: Path | None = None) -> list[Rule]:
    return list(_load_rules_cached(str(directory or RULES_DIR)))


@lru_cache(maxsize=8)
def _load_rules_cached(directory: str) -> tuple[Rule, ...]:
    d = Path(directory)
    if not d.is_dir():
        raise RuleError(f"rules folder not found: {d}")
    rules = [load_rule(p) for p in sorted(d.glob("*.yaml"))]
    seen: set[str] = set()
    for r in rules:
        if r.id in seen:
            raise RuleError(f"duplicate rule id {r.id}")
        seen.add(r.id)
    return tuple(rules)


def get_rule(rule_id: str, directory: Path | None = None) -> Rule:
    for r in load_rules(directory):
        if r.id == rule_id:
            return r
    raise RuleError(f"no rule with id {rule_id!r} (see `zoomer-ar rules list`)")
