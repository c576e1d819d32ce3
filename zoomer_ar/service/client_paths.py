"""A service job's analysis told with the names the client uploaded, never the server's folders.

The worker analyses `<data>/jobs/<id>/input/trace/<file>` or `<data>/jobs/<id>/input/ranks/[<folder>/]...`
(zoomer_ar.service.uploads); the client knows `<file>`, its archive's entries and its archive's name.
`ClientPaths` rewrites every path under the job's input folder to those names: the trace as the file
name the client sent (`weird name (1).txt`, not the server's `trace.json.gz`), a rank archive's entries as they were in the archive (`dataloader_bound/rank-0.json`), the
archive's own folder, when it had no single top folder, as the archive's file name, the source
archive's entries as `source/...`. The reports, findings.json and the store's records of the run
(traces.path, the analysis' notes) all show these names.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ..models import Analysis


@dataclass(frozen=True)
class ClientPaths:
    """Rewrites server paths under one job's input folder (`input_dir`) to the client's names."""

    input_dir: str
    params: dict[str, Any]

    @cached_property
    def _pattern(self) -> tuple[re.Pattern[str], dict[str, str]]:
        """The server prefixes (each spelling of the input folder: as stored, absolute, resolved), the longest
        first, and the client name each stands for."""
        kind = self.params.get("input")
        uploads = self.params.get("uploads") or {}
        archive = (uploads.get("ranks") or {}).get("filename") or "ranks"
        trace = (uploads.get("trace") or {}).get("filename")
        names: dict[str, str] = {}
        for inp in {self.input_dir, os.path.abspath(self.input_dir), str(Path(self.input_dir).resolve())}:
            if kind == "trace" and trace and self.params.get("path"):  # the file as the client named it
                names[os.path.join(inp, *str(self.params["path"]).split("/"))] = trace
            if kind in ("trace", "ranks"):
                kind_dir = f"{inp}{os.sep}{kind}"
                names[kind_dir + os.sep] = ""
                names[kind_dir] = archive if kind == "ranks" else "trace"
            names[inp + os.sep] = ""
            names[inp] = "the job's inputs"
        alternatives = "|".join(re.escape(k) for k in sorted(names, key=len, reverse=True))
        return re.compile(alternatives), names

    def text(self, s: str) -> str:
        """`s` with every server path under the job's input folder told as the client's name."""
        if not self.input_dir:
            return s
        pattern, names = self._pattern
        return pattern.sub(lambda m: names[m.group(0)], s)

    def value(self, v: Any) -> Any:
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {self.value(k): self.value(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, tuple):
            return tuple(self.value(x) for x in v)
        return v

    def analysis(self, analysis: Analysis) -> Analysis:
        """A copy of `analysis` whose strings (job and rank paths, skipped files, notes, findings) name no
        server path; `analysis` itself is left as it is (the relaunch spec reads job.json beside its files)."""
        return Analysis.model_validate(self.value(analysis.model_dump(mode="python")))
