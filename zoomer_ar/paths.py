"""Where the project's data folders live (rules/, fixers/, reports/, models/).

In a checkout (editable install, or the package on PYTHONPATH) they are the top-level folders of
the repository. An installed wheel carries them inside the package, as `zoomer_ar/_bundled/<name>`
(setup.py), and they are read from there. `ZOOMER_AR_HOME` points at another project folder.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
BUNDLED_DIR = PACKAGE_DIR / "_bundled"
_HOME = os.environ.get("ZOOMER_AR_HOME")
PROJECT_DIR = Path(_HOME) if _HOME else PACKAGE_DIR.parent
#: the folder holding rules/, fixers/, reports/ and models/
DATA_DIR = PROJECT_DIR if (_HOME or not BUNDLED_DIR.is_dir()) else BUNDLED_DIR

RULES_DIR = DATA_DIR / "rules"
FIXERS_DIR = DATA_DIR / "fixers"
REPORTS_DIR = DATA_DIR / "reports"
MODELS_DIR = DATA_DIR / "models"
TRAINING_DATA_DIR = PROJECT_DIR / "training_data"
