"""gzip inflation for the loaders: zlib-ng where installed (about twice zlib's speed here, same
API and output), else the standard zlib. Both release the GIL while they work, so a reader thread
inflates while the main thread parses."""

from __future__ import annotations

try:
    from zlib_ng import zlib_ng as _impl
except ImportError:  # pragma: no cover - zlib-ng is a declared dependency; stdlib as a fallback
    import zlib as _impl

import zlib

GZIP_WBITS = 16 + zlib.MAX_WBITS
ERRORS: tuple[type[Exception], ...] = tuple({zlib.error, _impl.error})
IMPLEMENTATION = _impl.__name__


def gzip_inflater():
    """A decompress object for one gzip member (`decompress`, `unconsumed_tail`, `unused_data`, `eof`)."""
    return _impl.decompressobj(GZIP_WBITS)
