# Fresh machine: `make demo` (install + a short offline night, rescored), `make test` (install + tests,
# the docs site's strict build among them).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test test-slow bench clean

# NEMO_PYTHON: the Python >= 3.12 the NeMo Gym export's real nemo-gym runs on (default: found on
# PATH or pyenv). Its venv lives in the user cache, built once (a few minutes); without such a
# Python, or offline, `export --smoke` falls back to contract mode, so this never fails the install.
NEMO_PYTHON ?=
install: $(VENV)/.installed
	@$(PY) -m orchestrator.export.real_nemo_gym $(if $(NEMO_PYTHON),--python "$(NEMO_PYTHON)") || true

# constraints.txt: the tested versions (the Modal image installs through it too)
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt "$(TORCH_SPEC)"
	$(PY) -m pip install -q -c constraints.txt -e ".[test,export,docs]"
	touch $@

# a short offline night from a start weakened on purpose (the night benchmark's pendulum-gamma), then
# the start and the best rescored on fresh seeds, and the report (bench/demo.py says what it does)
demo: install
	$(PY) -m bench.demo

# one worker per core: most tests wait on real subprocesses (training budgets, timeouts), so two
# workers on 2 cores halve the wall time; PYTEST_WORKERS=0 runs them in one process. worksteal: a
# worker that runs out of tests takes some of the other's queue (plain load scheduling left one
# worker alone on its share for the last minutes)
# `make test` leaves out the tests marked slow (end-to-end nights and long verifications, each over
# ~30 s): within 15 minutes on 2 cores. `make test-slow` runs those; CI runs both.
PYTEST_WORKERS ?= auto
PYTEST_ARGS := -q -n $(PYTEST_WORKERS) --dist worksteal --durations=30
test: install
	$(PY) -m pytest $(PYTEST_ARGS) -m "not slow"
	@echo "(the slow set, which CI also runs: make test-slow)"

test-slow: install
	$(PY) -m pytest $(PYTEST_ARGS) -m slow

clean:
	rm -rf $(VENV) .pytest_cache
