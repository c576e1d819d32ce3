"""`python -m zoomer_ar ...`: the same as the `zoomer-ar` command."""

import sys

from .cli import main

sys.exit(main())
