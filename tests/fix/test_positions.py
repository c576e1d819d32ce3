"""zoomer_ar.fix.positions gives exactly libcst's PositionProvider ranges, node for node: on this
project's own sources, the fixers' examples and sources written to stress the code generator
(CRLF and lone CR line ends, tabs, form feeds, backslash continuations, semicolons, decorators,
nested f-strings, match, async, walrus, comments everywhere)."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from zoomer_ar.fix.positions import positions
from zoomer_ar.fix.registry import load_registry

REPO = Path(__file__).resolve().parents[2]

ODD = [
    "x = 1\r\ny = (2,\r\n     3)\r\n",
    "a = 1\rb = [1,\r  2]\r",
    "if x:\n\tpass\n\tif y:\n\t\tz = 1  # tab\n",
    "\x0cimport os\n\x0c\ndef f():\n    return 1\n",
    "x = 1 + \\\n    2 + \\\n        3\n",
    "a = 1; b = 2; c = a + b  # three\n",
    "@decorator(\n    arg,  # comment\n)\n@other\nclass C(Base, metaclass=M):\n    '''doc'''\n    async def m(self, *a, k=1, **kw) -> int:\n"
    "        async with ctx() as c, other() as d:\n            async for i in it:\n                await c(i)\n        return (y := 3)\n",
    "s = f\"{x!r:>{width}} {f'{y}'} {{}}\" 'tail' \\\n    \"more\"\nt = rb'\\d' b'x'\n",
    "match cmd:\n    case [\"go\", *rest] if rest:\n        pass\n    case {\"k\": v, **kw}:\n        pass\n    case Point(x=0) | None:\n        pass\n    case _:\n        pass\n",
    "lam = lambda a, /, b=2, *, c: (a, b, c)\nx = [i for i in range(3) if i if not i]\ny = {k: v for k, v in d.items()}\nz = (yield)\n",
    "try:\n    pass\nexcept* (A, B) as e:\n    raise X from e\nelse:\n    pass\nfinally:\n    del a[1:2, ::3], b\n",
    "def f(\n    a,  # a\n    # lone comment\n    b,\n):\n    global g\n    nonlocal_ = 1\n    return\n\n\n# trailing\n",
    "",
    "\n\n",
    "x = 1",  # no newline at the end
]


def _sources() -> list[tuple[str, str]]:
    out = [(f"odd {i}", s) for i, s in enumerate(ODD)]
    for folder in ("zoomer_ar", "fixers", "training_data/scenarios"):
        out += [(str(p.relative_to(REPO)), p.read_text(encoding="utf-8")) for p in sorted((REPO / folder).rglob("*.py"))]
    for cls in load_registry().fixers:
        out += [(f"{cls.name} valid {i}", s) for i, s in enumerate(cls.VALID)]
        out += [(f"{cls.name} invalid {i}", e.before) for i, e in enumerate(cls.INVALID)]
        out += [(f"{cls.name} fixed {i}", e.after) for i, e in enumerate(cls.INVALID) if e.after]
    return out


def test_the_same_ranges_as_libcst_on_every_node():
    checked = 0
    for name, source in _sources():
        try:
            module = cst.parse_module(source)
        except cst.ParserSyntaxError:
            continue
        ref = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        got = positions(module)
        assert set(got) == set(ref), name
        bad = next((n for n in ref if got[n] != ref[n]), None)
        assert bad is None, f"{name}: {type(bad).__name__} at {ref[bad]} -> {got[bad]}"
        checked += len(ref)
    assert checked > 500_000


def test_unknown_node_is_a_key_error():
    got = positions(cst.parse_module("x = 1\n"))
    with pytest.raises(KeyError):
        got[cst.Name("y")]
