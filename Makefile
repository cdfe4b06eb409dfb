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
# JIT-built torch extensions (GPT-NeoX's, DeepSpeed's) live in this checkout: nothing left in ~/.cache by another
# run, killed mid-build, can hold a lock this one waits on
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/build/torch_extensions

.PHONY: venv demo test test-fast bench bench-shaped tune-shaped bench-nodes bench-two-transports e2e-shaped convergence convergence-znaive rate-distortion model kernels-host kernels-check sass-estimate gpu-check gpu-expected gpu-bundle mutants clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build of torch from local disk first, so later dependency ranges are already satisfied
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,mpi,neox]' -c <(echo torch==2.13.0)
	# DeepSpeed's sdist imports torch at build time: build it against the torch above, not an isolated (CUDA) one.
	# Its CPU shared-memory comm op is compiled into the wheel (DS_BUILD_SHM_COMM=1): otherwise every rank's
	# init_distributed JIT-builds it under a lock file that a rank killed mid-build leaves behind, and every later
	# DeepSpeed start waits on that file forever (what timed a CI run out). --no-cache-dir: a cached wheel lacks it.
	DS_BUILD_SHM_COMM=1 $(PY) -m pip install -q --no-cache-dir --no-build-isolation deepspeed==0.19.8
	touch $@

venv: $(STAMP)

kernels-host: venv
	$(PY) -m ccoll.kernels build

# nvcc (sm_80, sm_90) and NVRTC from the nvidia-cuda-nvrtc wheel (sm_80, sm_90 cubins) with exactly the
# cupy backend's options (kernels.NVRTC_OPTIONS); every kernel the codecs launch must be in the module; prints
# registers / local memory per kernel (ptxas -v) and fails a plain quant kernel above 64 registers or with a stack
kernels-check: venv
	$(PY) -m ccoll.kernels check

# the zfp encoder's roofline estimate in kernels/zfp.cu's header (tools/sass_estimate.py): NVRTC with the codec's
# options + -lineinfo, nvdisasm, basic blocks weighted by a Python mirror of the coder checked against libzfp.
# nvdisasm comes from its pip wheel (~5 MB) installed under build/tools/, not into the venv: nothing else needs it.
NVDISASM_WHEEL := nvidia-cuda-nvdisasm==13.5.37
sass-estimate: venv
	test -x build/tools/nvdisasm/nvidia/cu13/bin/nvdisasm || \
	  $(PY) -m pip install -q --no-deps --target build/tools/nvdisasm $(NVDISASM_WHEEL)
	$(PY) tools/sass_estimate.py

# kernels-check (sm_80/sm_90 compile) runs inside the suite: tests/unit/test_kernels_build.py
test: venv kernels-host
	$(PY) -m pytest -q -ra --durations=20 tests

# realistic bugs (kernel bounds, device-only rounding, NaN rules, barriers, stream hand-offs, chunk bounds), each
# applied to a temporary copy of the tree and run against only the tests that should catch it: a table of
# mutation, caught, by which test (tools/mutants.py; minutes, not in CI). MUTANTS_ARGS="--only zfp --baseline"
mutants: venv kernels-host
	$(PY) tools/mutants.py $(MUTANTS_ARGS)

test-fast: venv kernels-host
	$(PY) -m pytest -q -ra tests/unit

demo: venv
	$(PY) -m ccoll.convergence --demo --out results/demo

# the default comparison (ccoll.convergence's defaults: TP2 x DP2, 2 x 64 model, 120 steps): baseline, naive,
# hybrid, zhybrid x 3 seeds paired by seed, held-out loss, verdicts; then the model checked against its bytes
convergence: venv
	$(PY) -m ccoll.convergence --out results/convergence
	$(PY) -m ccoll.model --validate results/convergence/summary.json

# optional: znaive too, in the same runs (reuses the finished runs of `make convergence`, adds znaive's)
convergence-znaive: venv
	$(PY) -m ccoll.convergence --reuse --policies configs/baseline.yaml configs/naive.yaml configs/hybrid.yaml configs/zhybrid.yaml configs/znaive.yaml --out results/convergence
	$(PY) -m ccoll.model --validate results/convergence/summary.json

# capture the tensors that travel (DP2xPP2 and TP2xDP2, demo size, 60 steps, baseline: exact training),
# then every codec's rate-distortion on them: table, JSON and plot
rate-distortion: venv
	$(PY) -m ccoll.convergence --demo --policies configs/baseline.yaml --steps 60 --dp 2 --pp 2 --tp 1 --capture results/capture/dp2pp2 --out results/capture_run_dp2pp2
	$(PY) -m ccoll.convergence --demo --policies configs/baseline.yaml --steps 60 --dp 2 --pp 1 --tp 2 --capture results/capture/tp2dp2 --out results/capture_run_tp2dp2
	$(PY) -m ccoll.bench.rd results/capture --max-per-class 6 --json results/rd.json --plot results/rd.png | tee results/rd.txt

# predicted step time and speed-up of each preset on its node file: each codec at the GPU's memory roofline (as the
# README's table), or every codec at CODEC_GBPS=... GB/s; then the scored protocol and the seed paper's envelope
CODEC_GBPS ?=
model: venv
	$(PY) -m ccoll.model --clusters $(if $(CODEC_GBPS),--codec-gbps $(CODEC_GBPS)) --policy configs/hybrid.yaml --policy configs/zhybrid.yaml --policy configs/naive.yaml
	$(PY) -m ccoll.model --published

BENCH_CODECS := native,none,bf16,int8:block=256,int4:block=64,zfp:rate=8

# codec rate-distortion + CPU throughput, then all_reduce on loopback (4 ranks), with a plot
bench: venv kernels-host
	$(PY) tools/bench_codecs.py
	$(PY) -m ccoll.bench all_reduce -b 1K -e 64M -f 4 --np 4 --codec $(BENCH_CODECS) --json results/bench/loopback.json
	$(PY) -m ccoll.bench.plot results/bench/loopback.json

# as root: hybrid vs baseline training on DP4 ranks behind 1 Gbit/s and 100 Mbit/s links (a model whose DP
# gradients dominate the traffic): samples/s of both, measured vs predicted speedup (ccoll.model with the codec
# throughput the policy's run measured on itself), and the predicted step decomposed into compute, wire and codec
e2e-shaped: venv
	$(PY) -m ccoll.convergence.shaped --rates 1gbit 100mbit --out results/shaped

# as root: 4 ranks in network namespaces, 1 Gbit/s per rank (the bandwidth-bound regime)
bench-shaped: venv kernels-host
	$(PY) -m ccoll.bench.netem --ranks 4 --rate 1gbit -- $(PY) -m ccoll.bench all_reduce -b 64M -e 64M -n 5 -w 1 --codec $(BENCH_CODECS) --json results/bench/shaped_1gbit.json
	$(PY) -m ccoll.bench.plot results/bench/shaped_1gbit.json

# as root: python -m ccoll.tune on shaped links, 2 and 4 ranks x 1 Gbit/s and 100 Mbit/s, 64 KiB..64 MiB; each run
# re-times every shipped policy beside the tuned one (--compare) and prints tuned vs native and vs the best static
tune-shaped: venv kernels-host
	for cfg in "4 1gbit" "2 1gbit" "2 100mbit" "4 100mbit"; do set -- $$cfg; \
	  $(PY) -m ccoll.bench.netem --ranks $$1 --rate $$2 -- $(PY) -m ccoll.tune --sizes 64K,1M,8M,64M -n 2 -w 0 \
	    --rounds 3 --ops all_reduce --dims dp,tp --out results/tune/tuned_r$$1_$$2.yaml --compare configs/*.yaml \
	    || exit 1; done

# as root: 2 namespaces ("nodes") x 2 ranks, unshaped inside a node, 1 Gbit/s and 100 Mbit/s between nodes:
# hierarchical (hierarchy: node) vs flat all_reduce, time, error and bytes on the nodes' links
bench-nodes: venv kernels-host
	$(PY) -m ccoll.bench.nodes --rate 1gbit --sizes 1M,4M,16M,64M --json results/bench/nodes_1gbit.json
	$(PY) -m ccoll.bench.nodes --rate 100mbit --sizes 1M,4M,16M,64M --json results/bench/nodes_100mbit.json

# torch.distributed (gloo) + MPI in one job: 1000 mixed collectives, async handles waited in per-rank orders
bench-two-transports: venv
	$(BIN)/mpiexec --allow-run-as-root --oversubscribe -n 4 $(PY) -m ccoll.bench.two_transports --calls 1000 --wait-order rank

# On a CUDA machine, with that machine's own interpreter (torch with CUDA, CuPy, numpy; no network, no zfpy,
# no nvcc needed): never installs anything, never builds .venv, compiles nothing when build/gpu/ is carried.
# Throughput beside the device copy bandwidth, then bytes against ccoll/gpucheck/expected.json, then collectives on
# the simulated world; the report in $(GPU_CHECK_OUT)/gpu_check.json after every phase. Exit 0 passed,
# 1 a mismatch or missing digest, 2 no CUDA, 3 the deadline left something not run. See README.
# e.g. make gpu-check PYTHON=python3 GPU_CHECK_ARGS="--out $$OUT"
GPU_CHECK_OUT ?= results/gpu_check
gpu-check:
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) -m ccoll.gpucheck --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

# The expected digests gpu-check compares with (torch backend, zfp through zfpy): commit the file it writes
gpu-expected: venv
	$(PY) -m ccoll.gpucheck.expected

# Cubins of kernels/*.cu for sm_80 and sm_90 into build/gpu/ (NVRTC wheel), carried to a GPU machine
gpu-bundle: venv
	$(PY) tools/gpu_bundle.py

clean:
	rm -rf build .pytest_cache results
