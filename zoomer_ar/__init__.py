"""Zoomer AR: PyTorch profiler traces in, ranked evidenced findings, patches and relaunch specs out."""

__version__ = "0.1.0"
