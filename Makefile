# The README's promise: `make run` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch 2.13.0 is the CPU build that installs from local disk on the project machines;
# the package metadata itself accepts any torch>=2.2.
TORCH_PIN ?= torch==2.13.0
STAMP  := $(VENV)/.installed
# benchmarks run one torch / BLAS thread (their figures say so)
BENCH  := OMP_NUM_THREADS=1 $(PY)

.PHONY: install run test test-slow test-stan test-all lint bench-pymc bench-pymc-conjugate bench-schemes bench-sgpt bench-adaptive bench-distributed \
        bench-memory bench-deep bench-deep-speed bench-peers bench-posteriordb bench-multimodal-stan bench-scaling bench-headline bench-headline-loop bench-compile bench-outputs bench-parts bench-variational fuzz-cli clean \
        golden-record golden-compare

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[dev,arviz,deep,pymc,stan]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/nrpt run --out runs/default --figures true --overwrite

# two workers (one per core of the project machines), whole files per worker: the suite is
# single-threaded tiny-tensor code, so this halves its wall time (`pytest tests/x.py` stays serial)
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile

# long statistical checks (marked slow: exact event rates over a grid of schemes, the tighter
# stochastic-gradient distribution checks)
test-slow: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m slow

# Stan programs as targets (marked stan): compiles C++ with g++ (about a minute on a cold
# cache, $NRPT_STAN_CACHE or ~/.cache/nrpt/stan; seconds once cached)
test-stan: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m stan

# everything: the default selection, the slow checks, the torch.compile tests (marked compile),
# the multi-process ones (marked distributed) and the Stan ones (marked stan); `make test`
# leaves the last four out
test-all: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m ""

# the contracts, typed: mypy checks them alone (errors of the modules they import are silenced;
# `$(VENV)/bin/mypy src/nrpt` reports the whole package)
CONTRACTS := src/nrpt/roles.py src/nrpt/rng.py src/nrpt/scalars.py src/nrpt/options.py src/nrpt/files.py src/nrpt/core

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy --follow-imports=silent $(CONTRACTS)

bench-schemes: $(STAMP)
	$(BENCH) benchmarks/schemes.py

# Deng et al. (2023) simulations, DEO*-SGD (docs/reproduction/): all, or one of
# bench-sgpt-fig4a / -fig5 / -fig3 / -c21 / -vr / -r2sgld / -speed
bench-sgpt: $(STAMP)
	$(BENCH) benchmarks/deo_star_sgd.py all

bench-sgpt-%: $(STAMP)
	$(BENCH) benchmarks/deo_star_sgd.py $*

# the variational reference vs the prior on Bayesian logistic regression (docs/variational.md)
bench-variational: $(STAMP)
	$(BENCH) benchmarks/variational.py

# adaptive NRPT against the analytic Gaussian path (docs/benchmarks-adaptive.md)
bench-adaptive: $(STAMP)
	$(BENCH) benchmarks/adaptive.py

# per-iteration cost of 1, 2 and 4 gloo processes (docs/benchmarks.md)
bench-distributed: $(STAMP)
	$(BENCH) benchmarks/distributed.py

# resident memory of runs of 10k, 100k and 1M iterations (docs/benchmarks.md)
bench-memory: $(STAMP)
	$(BENCH) benchmarks/memory.py

# cost per iteration vs P and dimension: full loop, bare explorer step, energy+gradient floor
# (docs/benchmarks.md; writes benchmarks/scaling.json and docs/figures/scaling_*.png)
bench-scaling: $(STAMP)
	$(BENCH) benchmarks/scaling.py

# the headline run (`nrpt run`) against its NumPy yardstick: loop and whole process, round-robin,
# 5 repeats; writes benchmarks/headline.json (docs/benchmarks.md)
bench-headline: $(STAMP)
	$(BENCH) benchmarks/headline.py

# the headline loop alone against the NumPy yardstick, 5 interleaved pairs, CPU and wall
# (issue 24's "<= 2x without compilation"; docs/benchmarks.md)
bench-headline-loop: $(STAMP)
	$(BENCH) benchmarks/headline_loop.py

# what a process pays before its first compiled iteration, cold and warm inductor cache
bench-compile: $(STAMP)
	$(BENCH) benchmarks/compile_cache.py --arms cold,warm,aot --precompile

# what the headline run's outputs (summary, posterior.nc, figures) cost in its whole process,
# 5 repeats (docs/benchmarks.md, "Outputs"); `--against OTHER/src` times another tree beside it
bench-outputs: $(STAMP)
	$(BENCH) benchmarks/outputs.py

# where an iteration's time goes: each adaptor, recorder and the explorer step on its own, with
# and without torch.inference_mode, and the aten ops of one iteration (docs/benchmarks.md)
bench-parts: $(STAMP)
	$(BENCH) benchmarks/parts.py

# deep posteriors (docs/reproduction/deep.md): strategy throughput, the equal-budget table on
# MNIST-1D, round trips with W* vs W = 1
bench-deep: $(STAMP)
	$(BENCH) benchmarks/deep.py throughput
	$(BENCH) benchmarks/deep.py table --dataset mnist1d --seeds 5
	$(BENCH) benchmarks/deep.py windows --dataset mnist1d --seeds 3

# nrpt.deep.fit against a plain PyTorch loop training the same P models (MLP and CNN on digits,
# ResNet-20 on synthetic-cifar), paired and interleaved (docs/reproduction/deep.md); on a GPU:
# PYTHONPATH=src python3 benchmarks/deep_speed.py --device cuda --cases resnet20-synthetic --chains 10
bench-deep-speed: $(STAMP)
	$(BENCH) benchmarks/deep_speed.py --pairs 5 --json benchmarks/deep_speed_cpu.json

# nrpt beside TFP's ReplicaExchangeMC, ptemcee and reddemcee on mix25 (docs/benchmarks.md); the
# peers are installed (pinned) into the throwaway venv benchmarks/peers/.venv on first use
bench-peers: $(STAMP)
	$(BENCH) benchmarks/peers/bench.py

# every CLI flag with 8 bad words: clear errors, no tracebacks, nothing silently accepted
fuzz-cli: $(STAMP)
	$(BENCH) benchmarks/fuzz_cli.py

# golden outputs of a fixed list of runs (benchmarks/golden.py), bit for bit across a refactor:
# make golden-record OUT=golden/new; make golden-compare A=golden/base B=golden/new
OUT ?= golden/new
A   ?= golden/base
B   ?= golden/new
golden-record: $(STAMP)
	$(BENCH) benchmarks/golden.py record $(OUT)

golden-compare: $(STAMP)
	$(BENCH) benchmarks/golden.py compare $(A) $(B)

clean:
	rm -rf $(VENV) runs build *.egg-info src/*.egg-info

# PyMC models: log Z against pm.sample_smc at equal wall time, at two budgets (docs/pymc.md)
bench-pymc: $(STAMP)
	$(BENCH) benchmarks/pymc_smc.py --smc-draws 1000 --json benchmarks/pymc_smc_1000.json
	$(BENCH) benchmarks/pymc_smc.py --smc-draws 5000 --json benchmarks/pymc_smc_5000.json

# posteriordb's reference posteriors: nrpt (default settings, from_stan) against Stan's NUTS at
# the same wall time (docs/posteriordb.md); resumable: PDB_ARGS="--only garch11", "--quick", "--force";
# "--keep-nuts" re-runs nrpt keeping the stored NUTS runs; "--log-z-check" adds a second reference's log Z
PDB_ARGS ?=
bench-posteriordb: $(STAMP)
	$(BENCH) benchmarks/posteriordb.py $(PDB_ARGS)

# a two-mode Stan model of our own (exact answers): nrpt against NUTS at the same wall time,
# positive-mode mass, means, sds, R-hat, ESS/s, whether NUTS's chains disagree (docs/posteriordb.md)
MM_ARGS ?=
bench-multimodal-stan: $(STAMP)
	$(BENCH) benchmarks/multimodal_stan.py $(MM_ARGS)

# conjugate PyMC models: posterior means, variances and log Z against closed forms (docs/pymc.md)
bench-pymc-conjugate: $(STAMP)
	$(BENCH) benchmarks/pymc_conjugate.py --systems 16 --seed 2
	$(BENCH) benchmarks/pymc_conjugate.py --systems 16 --seed 2 --reference variational
