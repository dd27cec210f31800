# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
OUT    := results

.PHONY: demo test bench venv clean

venv: $(STAMP)

# torch first and exactly: `pip install torch==2.13.0` takes the CPU wheel on disk.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	mkdir -p $(OUT)
	$(VENV)/bin/dlcomm train --workload digits-cnn --workers 4 --exchange ring --epochs 5 \
		--json $(OUT)/demo.json --plot $(OUT)/demo.png

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m pytest -q -m "slow or bench"

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .hypothesis
