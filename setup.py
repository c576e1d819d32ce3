"""Packaging details pyproject.toml cannot say: the data folders travel inside the wheel.

`rules/`, `fixers/`, `reports/` and `models/` live at the top of the repository (one file per
anti-pattern, one codemod per fix, ...). A wheel carries them as `zoomer_ar/_bundled/<name>`,
which `zoomer_ar.paths` uses when the package is installed rather than run from a checkout.
It also declares the optional compiled event reader and partition scanner. Everything else is in pyproject.toml.
"""

from setuptools import Extension, find_packages, setup

BUNDLED = {
    "rules": ["*.yaml"],
    "fixers": [],  # Python modules: copied as the package's modules
    "reports": ["*.j2"],
    "models": ["CURRENT", "HISTORY.jsonl", "v*/*.txt", "v*/*.json", "v*/*.md"],
}

packages = find_packages(include=["zoomer_ar", "zoomer_ar.*"])
package_dir = {"": "."}
package_data = {"": ["*.yaml", "*.j2", "*.json", "*.txt", "*.ini", "*.mako"]}
for name, patterns in BUNDLED.items():
    pkg = f"zoomer_ar._bundled.{name}"
    packages.append(pkg)
    package_dir[pkg] = name
    if patterns:
        package_data[pkg] = patterns

# The JSON lexer both compiled extensions include (strings, numbers, skipping values): listed in
# their `depends` so that a change to it rebuilds both, and so that an sdist carries it.
JSON_LEX = "zoomer_ar/load/_jsonlex.h"

# The compiled event reader is an accelerator: without a C compiler the install goes on and the
# loader uses msgspec (zoomer_ar/load/fastcols.py).
FAST_JSON = Extension(
    "zoomer_ar.load._fastjson",
    sources=["zoomer_ar/load/_fastjson.c"],
    depends=[JSON_LEX],
    extra_compile_args=["-O2"],
    optional=True,
)

# The compiled event scanner of `trace partition` (zoomer_ar/surgery/partition_fast.py), optional
# the same way: without it partition_trace cuts traces with msgspec.
PART_SCAN = Extension(
    "zoomer_ar.surgery._partscan",
    sources=["zoomer_ar/surgery/_partscan.c"],
    depends=[JSON_LEX],
    extra_compile_args=["-O2"],
    optional=True,
)

setup(packages=packages, package_dir=package_dir, package_data=package_data, ext_modules=[FAST_JSON, PART_SCAN])
