# Zoomer AR: `make demo` sets up and analyses the bundled example; `make test` runs the suite.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.zoomer-setup-stamp

.PHONY: setup demo test test-fast lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py zoomer_ar/load/_fastjson.c zoomer_ar/load/_jsonlex.h zoomer_ar/surgery/_partscan.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch: the local CPU wheel, pinned so no resolver ever pulls a CUDA build.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[dev,hta]" "torch==2.13.0"
	# TorchFix (pyproject extra "peers"), without its dependencies: they would downgrade libcst.
	$(BIN)/python -m pip install -q --no-deps "torchfix==0.7.0"
	touch $(STAMP)

demo: setup
	$(BIN)/zoomer-ar analyze examples/traces/dataloader_bound --source training_data/scenarios --out zoomer-out/demo
	$(BIN)/zoomer-ar analyze examples/gpu/sync_point --source training_data/scenarios --out zoomer-out/demo-gpu
	@echo "Reports: zoomer-out/demo/report.html zoomer-out/demo/report.md zoomer-out/demo/findings.json"
	@echo "GPU (H200 recording): zoomer-out/demo-gpu/report.html zoomer-out/demo-gpu/patch.diff"

test: setup
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

lint: setup
	$(BIN)/ruff check zoomer_ar fixers rules benchmarks training_data tests

test-fast: setup
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

clean:
	rm -rf $(VENV) zoomer-out .pytest_cache
