"""glibc heap settings for the streaming pass: large arrays in their own mappings, freed memory handed back."""

from __future__ import annotations

import os

M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
try:  # ZOOMER_MMAP_THRESHOLD=0 leaves glibc's dynamic threshold alone (less CPU, more memory)
    MMAP_THRESHOLD = int(os.environ.get("ZOOMER_MMAP_THRESHOLD", 256 << 10))
except ValueError:
    MMAP_THRESHOLD = 256 << 10


def fix_mmap_threshold() -> None:
    """Serve every allocation of 256 KiB or more (numpy columns, masks, index arrays) with its own
    mmap, so that freeing it returns the memory at once. glibc otherwise raises its threshold
    each time a large block is freed (up to 32 MiB) and later arrays come from the heap, which
    keeps their pages after they are freed, and the 1 MB chunks and slices of the load fragment
    it. The price is CPU: every such block is a fresh mapping whose pages fault in. Measured with
    `ZOOMER_MMAP_THRESHOLD=0|262144 python benchmarks/bench_huge.py --sizes 1 --no-hta --no-msgspec`
    (docs/huge-traces.md): peak RSS 243 -> 219 MB, CPU 14.7 -> 16.7 s.
    Process-wide and once; a no-op off glibc."""
    global MMAP_THRESHOLD
    if MMAP_THRESHOLD <= 0:
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    except (OSError, AttributeError):
        pass
    MMAP_THRESHOLD = 0


def trim_heap() -> None:
    """Hand freed heap memory back to the OS (glibc); a no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
