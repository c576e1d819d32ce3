"""Cut a small excerpt around the first invalid event name of a trace that PyTorch's profiler wrote as
invalid JSON, keeping the profiler's own bytes (tests/test_repair.py reads the result).

compile_with_stack.pt.trace.json.gz came from

    .venv/bin/python tests/data/compile/recompile.py --with-stack --out /tmp/full.json.gz   # torch 2.13, CPU
    .venv/bin/python tests/data/broken_names/cut.py /tmp/full.json.gz tests/data/broken_names/compile_with_stack.pt.trace.json.gz

The full recording (309 MB of JSON) holds one Python-frame name Kineto wrote unescaped, the text of
a freed code object: a name `torch/_higher_order_ops/passes/inline_invoke_subgraph.py(0):` followed by
spaces and three raw quote characters
(pytorch/pytorch#146900, #186359); which name breaks, if any, changes from run to run. The excerpt is
the file's head up to the events array, 3,000 events on either side of that one, and the array's end.
"""

from __future__ import annotations

import gzip
import json
import re
import sys

SEP = b"\n  },\n  {"  # between two events, as torch 2.13 writes them
NAME = re.compile(rb'"name": "([^\n]*)",\n\s*"pid":')


def main(src: str, dst: str, around: int = 3000) -> None:
    data = gzip.open(src).read() if src.endswith(".gz") else open(src, "rb").read()
    for m in NAME.finditer(data):
        try:
            json.loads(b'"' + m.group(1) + b'"')
        except ValueError:
            bad = m.start()
            break
    else:
        raise SystemExit("no invalid name in this trace")
    head = data.find(b'"traceEvents": [') + len(b'"traceEvents": [')
    cuts = [m.start() for m in re.finditer(re.escape(SEP), data)]
    i = max(k for k, c in enumerate(cuts) if c < bad)
    a, b = cuts[max(0, i - around)], cuts[min(len(cuts) - 1, i + around)]
    out = data[:head] + b"\n" + data[a + len(b"\n  },\n") : b] + b"\n  }\n]\n}\n"
    with gzip.open(dst, "wb", compresslevel=9) as fh:
        fh.write(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
