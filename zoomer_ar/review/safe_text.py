"""File names as the review writes them: git allows any bytes but `/` and NUL in a name.

Paths are read from git as UTF-8 with ``surrogateescape`` (diff.unquote), so a name that is not UTF-8
(Latin-1 ``caf\\xe9.py``) holds a lone surrogate, which no UTF-8 output can carry: JSON encoders fail on
it or write a ``\\udce9`` escape that strict parsers refuse. Every output goes through one of these:

- ``readable``: such bytes as ``\\xe9`` (backslash escapes), for JSON, SARIF messages, Markdown and the
  GitHub API (a name GitHub cannot hold either: its inline comment is refused and listed in the body);
- ``quoted_path``: git's own quoting (``core.quotepath=off``) where a name holds such a byte, a control
  character (a line break would split the one-line-per-finding text format), a quote or a backslash.
"""

from __future__ import annotations

from typing import Any

_C_ESCAPES = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r", 34: '\\"', 92: "\\\\"}


def _has_surrogate(s: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in s)


def readable(s: str) -> str:
    """`s` with the bytes ``surrogateescape`` kept (non-UTF-8 ones) written as ``\\xNN``."""
    if not _has_surrogate(s):
        return s
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def readable_all(obj: Any) -> Any:
    """`obj` (JSON-like: dicts, lists, strings) with every string made ``readable``."""
    if isinstance(obj, str):
        return readable(obj)
    if isinstance(obj, dict):
        return {readable_all(k): readable_all(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [readable_all(v) for v in obj]
    return obj


def quoted_path(path: str) -> str:
    """The path as ``git -c core.quotepath=off`` prints it: unchanged unless it holds a control character,
    a quote, a backslash or a byte that is not UTF-8; then in double quotes with C escapes (octal bytes)."""
    if not (_has_surrogate(path) or any(ord(ch) < 32 or ch in '"\\\x7f' for ch in path)):
        return path
    out = bytearray()
    for b in path.encode("utf-8", "surrogateescape"):
        if b in _C_ESCAPES:
            out += _C_ESCAPES[b].encode()
        elif b < 32 or b == 127:
            out += f"\\{b:03o}".encode()
        else:
            out.append(b)
    # UTF-8 sequences stay as they are; a byte that is not part of one becomes an octal escape
    text = out.decode("utf-8", "surrogateescape")
    return '"' + "".join(f"\\{ord(ch) - 0xDC00:03o}" if "\udc80" <= ch <= "\udcff" else ch for ch in text) + '"'
