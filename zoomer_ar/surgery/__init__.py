"""Trace surgery (`zoomer-ar trace ...`): streaming filter, slice, sample, split, merge, compress."""

from .ops import (
    Stats, compress_trace, filter_job, filter_trace, job_files, merge_job, sample_job, slice_trace, split_trace, survey,
)
from .validate import check_trace

__all__ = ["Stats", "check_trace", "compress_trace", "filter_job", "filter_trace", "job_files", "merge_job",
           "sample_job", "slice_trace", "split_trace", "survey"]
