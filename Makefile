# ccoll — every target sets up .venv on first use (CPU torch 2.13.0 pinned: never a CUDA build by accident).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.ccoll-installed
export DS_ACCELERATOR ?= cpu
export DS_BUILD_OPS ?= 0
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: venv demo test test-fast bench bench-shaped convergence kernels-host kernels-check gpu-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build of torch from local disk first, so later dependency ranges are already satisfied
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,mpi,neox]' -c <(echo torch==2.13.0)
	# DeepSpeed's sdist imports torch at build time: build it against the torch above, not an isolated (CUDA) one
	$(PY) -m pip install -q --no-build-isolation deepspeed==0.19.8
	touch $@

venv: $(STAMP)

kernels-host: venv
	$(PY) -c "import sys, ccoll.kernels as k; sys.exit(k.main(['build']))"

kernels-check: venv
	$(PY) -c "import sys, ccoll.kernels as k; sys.exit(k.main(['check']))"

# kernels-check (sm_80/sm_90 compile) runs inside the suite: tests/unit/test_kernels_build.py
test: venv kernels-host
	$(PY) -m pytest -q -ra tests

test-fast: venv kernels-host
	$(PY) -m pytest -q -ra tests/unit

demo: venv
	$(PY) -m ccoll.convergence --demo --out results/demo

convergence: venv
	$(PY) -m ccoll.convergence --policies configs/baseline.yaml configs/naive.yaml configs/hybrid.yaml --out results/convergence

BENCH_CODECS := native,none,bf16,int8:block=256,int4:block=64,zfp:rate=8

# codec rate-distortion + CPU throughput, then all_reduce on loopback (4 ranks), with a plot
bench: venv kernels-host
	$(PY) tools/bench_codecs.py
	$(PY) -m ccoll.bench all_reduce -b 1K -e 64M -f 4 --np 4 --codec $(BENCH_CODECS) --json results/bench/loopback.json
	$(PY) -m ccoll.bench.plot results/bench/loopback.json

# as root: 4 ranks in network namespaces, 1 Gbit/s per rank (the bandwidth-bound regime)
bench-shaped: venv kernels-host
	$(PY) -m ccoll.bench.netem --ranks 4 --rate 1gbit -- $(PY) -m ccoll.bench all_reduce -b 64M -e 64M -n 5 -w 1 --codec $(BENCH_CODECS) --json results/bench/shaped_1gbit.json
	$(PY) -m ccoll.bench.plot results/bench/shaped_1gbit.json

# On a CUDA machine: kernels vs emulated/torch bytes for every deterministic codec + throughput table.
gpu-check:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) tools/gpu_check.py

clean:
	rm -rf build .pytest_cache results
