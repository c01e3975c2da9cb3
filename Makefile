# One task runner; the README names these targets.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: install engine images run demo test test-unit test-integration soak lint bench bench-quick

install:            ## install kernel_sandbox with its dev tools
	$(PIP) install -q -e ".[dev]"

engine:             ## a Docker engine that answers: as root on Debian/Ubuntu, installed and started
	scripts/engine.sh

images: engine install  ## build the sandbox images that are missing
	kernel-sandbox images build

run: images         ## the main job: install, build what is missing, run the demo
	kernel-sandbox demo

demo:
	kernel-sandbox demo

test:               ## both tiers; the integration tier needs a Docker engine
	$(PYTHON) -m pytest -q -rfEs

test-unit:
	$(PYTHON) -m pytest -q tests/unit

test-integration:
	$(PYTHON) -m pytest -q -rfEs tests/integration

soak:               ## full load test: 10 000 checked calls on 20 sandboxes (table: bench/soak.py)
	KS_SOAK_EXECUTIONS=10000 $(PYTHON) -m pytest -q -rfEs -s tests/integration/test_soak.py

lint:
	ruff check kernel_sandbox tests bench
	ruff format --check kernel_sandbox tests bench
	mypy

bench:              ## performance figures against baselines, printed and written to JSON
	$(PYTHON) bench/run.py

bench-quick:        ## the key ratios in < 2 min; exits 1 if one regressed past its margin
	$(PYTHON) bench/quick.py
