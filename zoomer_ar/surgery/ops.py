"""The operations of `zoomer-ar trace`, streaming; one module each, gathered here for the CLI:

- cut.py: `slice` (steps or a time window) and `split` (a file per step), with the device events
  launched from the steps kept wherever they run;
- filtering.py: `filter` by category (across the two Kineto schemas), name, pid, tid or phase;
- recode.py: `check`, `compress`, `repair`;
- jobs.py: rank folders (which files are which ranks), `sample` and `filter` of a job folder;
- merge.py: `merge` per-rank files into one trace;
- copying.py: what they share, the one-line report (Stats) and the copy of selected events.

Every operation reads its input slice by slice (io.read_events) and writes events verbatim (or,
for merge, re-encoded with remapped ids), so files of any size pass through in bounded memory.
Outputs are Chrome-format traces (`{"traceEvents": [...], ...}` with the input's other top-level
keys) that this tool, HTA and Perfetto open; metadata events (`ph: M`, process and thread names)
are always kept so that tracks stay named.
"""

from __future__ import annotations

from ..load.merged import ID_SHIFT, PID_STRIDE  # merge's pid and id offsets; the loader splits by them
from .copying import Stats
from .cut import Launches, Survey, launches, slice_trace, split_trace, survey
from .filtering import CATEGORY_EQUIVALENTS, canonical_category, compile_pattern, filter_trace
from .jobs import (
    JobFiles, choose_ranks, filter_job, job_files, job_folder, named_for, peek_top, probe_trace, rank_files,
    refuse_merged, sample_job,
)
from .merge import merge_job
from .recode import check_events, compress_trace, repair_trace

__all__ = [
    "CATEGORY_EQUIVALENTS", "ID_SHIFT", "PID_STRIDE", "JobFiles", "Launches", "Stats", "Survey", "canonical_category",
    "check_events", "choose_ranks", "compile_pattern", "compress_trace", "filter_job", "filter_trace", "job_files",
    "job_folder", "launches", "merge_job", "named_for", "peek_top", "probe_trace", "rank_files", "refuse_merged",
    "repair_trace", "sample_job", "slice_trace", "split_trace", "survey",
]
