"""Features stage: a documented, versioned feature vector per job, plus the evidence behind it."""

from .extract import JobFeatures, extract
from .schema import FEATURE_SCHEMA_VERSION, FeatureVector

__all__ = ["FEATURE_SCHEMA_VERSION", "FeatureVector", "JobFeatures", "extract"]
