"""Load stage: Kineto trace files -> columnar per-rank traces (`Job`)."""

from .columns import RankTrace
from .job import Job, load_job, load_trace

__all__ = ["Job", "RankTrace", "load_job", "load_trace"]
