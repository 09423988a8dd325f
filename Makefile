# fornax — one command runs the main job, one runs the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# byte-compile the checkout (an editable install is not compiled, and a process started with
# PYTHONDONTWRITEBYTECODE would compile every module again on every start); up-to-date files
# are skipped, so this takes well under a second when nothing changed
BYTECODE := $(BIN)/python -m compileall -q -j 0 fornax tests benchmarks
# the test workers share the cores already: one BLAS / OpenMP thread each (threads that wait spin)
SINGLE_THREADED := OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

.PHONY: run test bench bench-peers lint clean conformance-torch fuzz fuzz-atheris

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,plot,labs]'
	touch $(STAMP)

run: $(STAMP)
	@$(BYTECODE)
	$(BIN)/fornax compose --vendor rocm-like

test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check --select F fornax tests benchmarks
	$(BIN)/mypy                      # settings in pyproject.toml: strict for the seams, simulator, stack, report
	$(BYTECODE)
	$(SINGLE_THREADED) $(BIN)/python -m pytest -n 2 --dist loadfile --durations=25   # two workers, a file's tests on one; the slowest tests listed

bench: $(STAMP)
	@$(BYTECODE)
	$(BIN)/python -m benchmarks

# PyTorch's OpInfos, ModuleInfos and OptimInfos on every family (FAMILY=rocm-like: one), everything
conformance-torch: $(STAMP)
	$(BIN)/python -m fornax.contracts.torch_suite $(if $(FAMILY),--family $(FAMILY))

# every parser and loader a user can feed, 8,000 cases per target (over 10^5 in all)
fuzz: $(STAMP)
	$(BIN)/python -m fornax.fuzz --cases 8000

# coverage-guided fuzzing of the byte and text loaders (libFuzzer through atheris, an optional extra)
fuzz-atheris: $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[fuzz]'
	$(BIN)/python -m fornax.fuzz.atheris_run --runs 20000 --seconds 60

# fornax beside tinygrad's PYTHON device, Triton's interpreter and numba's CUDA simulator
# (the optional extra bench-peers; a few minutes: the slow emulators get about 60 s a figure)
bench-peers: $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[bench-peers]'
	$(BIN)/python -m benchmarks.peers

lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check --select F fornax tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info
