"""Synthetic Kineto traces: a small GPU/multi-rank training-job simulator with planted anti-patterns.

`generator.generate(seed, plants)` samples a job (ranks, streams, kernels, memcpy, NCCL collectives,
dataloader stalls, syncs, allocator calls, imbalance, stragglers), simulates it into Kineto JSON
documents, and labels every anti-pattern from what was planted and the cost it caused
(counterfactual re-simulation without the plant). `augment` injects patterns into real traces.
Distributions come from `params.json`, fitted to the real traces by `python -m zoomer_ar.synth.fit`.
"""
