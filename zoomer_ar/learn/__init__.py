"""Learning: the labelled corpus, LightGBM models per anti-pattern, evaluation, the model registry.

corpus.py (build the corpus) -> train.py (grouped CV, calibration, thresholds, held-out metrics)
-> registry.py (models/<version>/, CURRENT, promotion gate, rollback) -> model.py (inference,
used by zoomer_ar.detect.ensemble). See docs/learning.md.
"""
