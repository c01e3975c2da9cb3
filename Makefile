# One task runner; the README and docs/development.md name these targets.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: docs package tiers install engine images run demo test test-unit test-integration test-runsc test-kubernetes cluster-up cluster-down soak lint bench bench-server bench-replicas bench-quick bench-rl
#: Run a second time under gVisor (runtime="runsc", docs/how-to/gvisor.md): every
#: hostile-code suite (the glob takes new ones too) and the core sandbox tests.
RUNSC_TESTS ?= tests/integration/test_hostile*.py tests/integration/test_sandbox.py
#: The slowest tests of a run, listed at its end (what CI's time goes to).
DURATIONS ?= --durations=15
#: pytest-xdist workers of make test's first pass and gVisor pass (1: one process).
WORKERS ?= 3

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

test:               ## every tier: sets up what they need (root), unit + integration, then Kubernetes beside the gVisor pass
	PYTHON="$(PYTHON)" DURATIONS="$(DURATIONS)" WORKERS="$(WORKERS)" RUNSC_TESTS="$(RUNSC_TESTS)" scripts/test.sh

tiers:              ## set up what every tier needs, no tests (root; without: what cannot run here)
	PYTHON="$(PYTHON)" scripts/setup-tiers.sh

test-runsc:         ## the hostile and core suites with KERNEL_SANDBOX_RUNTIME=runsc (tcp is refused there)
	KERNEL_SANDBOX_RUNTIME=runsc $(PYTHON) -m pytest -q -rfEs $(DURATIONS) -m "not tcp_transport" $(RUNSC_TESTS)

test-unit:
	$(PYTHON) -m pytest -q tests/unit

test-integration:
	$(PYTHON) -m pytest -q -rfEs tests/integration

test-kubernetes:    ## the Kubernetes tier (KUBECONFIG, or the cluster of `make cluster-up`)
	$(PYTHON) -m pytest -q -rfEs tests/kubernetes

cluster-up:         ## a local single-node Kubernetes beside Docker (root); prints its KUBECONFIG
	scripts/k8s/cluster.sh up

cluster-down:       ## stop it, leaving the host as it was
	scripts/k8s/cluster.sh down

soak:               ## full load test: 10 000 checked calls on 20 sandboxes (table: bench/soak.py)
	KS_SOAK_EXECUTIONS=10000 $(PYTHON) -m pytest -q -rfEs -s tests/integration/test_soak.py

lint:               ## ruff, mypy (strict), and shellcheck on the programs that run inside sandboxes
	ruff check kernel_sandbox tests bench docs/hooks.py
	ruff format --check kernel_sandbox tests bench docs/hooks.py
	mypy
	shellcheck kernel_sandbox/programs/*.sh scripts/*.sh

bench:              ## performance figures against baselines, printed and written to JSON
	$(PYTHON) bench/run.py

bench-quick:        ## the key ratios in < 2 min; exits 1 if one regressed past its margin
	$(PYTHON) bench/quick.py

bench-server:       ## print(1+1) through HTTP and MCP vs in-process; 50 clients on 50 sandboxes
	$(PYTHON) bench/server.py

bench-replicas:     ## 50 clients on 50 sandboxes through 1, 2, 3 server replicas (Kubernetes) and --workers 1, 2 (Docker)
	$(PYTHON) bench/replicas.py

bench-rl:           ## evaluation workload: 16 sandboxes x 200 mixed cells, stock ipykernel and peers beside
	$(PYTHON) bench/rl.py

package:            ## build the wheel and sdist, twine check, run a sandbox from the wheel alone in a fresh venv
	PYTHON=$(PYTHON) scripts/check-package.sh

docs:               ## the docs site, built with --strict (a broken link or reference fails); site/
	$(PYTHON) -m mkdocs build --strict
