# Fresh machine: `make demo` (install + one short offline run), `make test` (install + tests).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,export]"
	touch $@

demo: install
	$(PY) -m orchestrator run --env Pendulum-v1 --budget 15 --max-experiments 4 --optuna-params LEARNING_RATE,JAX_LEARNING_RATE
	$(PY) -m orchestrator report

test: install
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
