# Two commands on a fresh machine:  `make run` (the main job)  and  `make test` (the tests).
# Both create .venv and install what they need; torch is installed first, pinned, so that no
# dependency pulls a multi-GB CUDA build.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: run test test-slow lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

run: $(VENV)/.installed
	$(BIN)/seqrec quickstart

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/lint-imports  # the layers and no import cycles: .importlinter

test: lint
	@command -v chromium >/dev/null 2>&1 || apt-get install -y -q chromium >/dev/null 2>&1 \
		|| echo "chromium could not be installed: the browser test of seqrec report is skipped"
	$(BIN)/python -m pytest -m "not slow"

# the attack suite's slow probes (memory caps on child processes, big sparse files, kills); CI
# runs them after `make test`
test-slow: $(VENV)/.installed
	$(BIN)/python -m pytest -m slow

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/reproduce.py pop-ml1m
	$(BIN)/python benchmarks/speed.py prepare-scale

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
