"""Detect stage: rules from `rules/` (and the model, when one is loaded) over the feature vector."""

from .bottleneck import classify
from .engine import rank_findings, run_rules
from .rules import Rule, get_rule, load_rules

__all__ = ["Rule", "classify", "get_rule", "load_rules", "rank_findings", "run_rules"]
