"""Where the project's data folders live (rules/, fixers/, reports/, models/)."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_DIR = Path(os.environ.get("ZOOMER_AR_HOME", PACKAGE_DIR.parent))

RULES_DIR = PROJECT_DIR / "rules"
FIXERS_DIR = PROJECT_DIR / "fixers"
REPORTS_DIR = PROJECT_DIR / "reports"
MODELS_DIR = PROJECT_DIR / "models"
TRAINING_DATA_DIR = PROJECT_DIR / "training_data"
