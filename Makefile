# Development tasks. The virtualenv is the one the README's Quickstart creates (.venv).
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup lint format test test-slow bench ci

setup:  ## the virtualenv with the test tools
	python3.11 -m venv $(VENV) && $(BIN)/pip install -q -e '.[dev]'

lint:  ## ruff (lint and format) and mypy, as CI runs them
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format:  ## rewrite files in the project's format and apply safe lint fixes
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test:  ## the default suite (what the Quickstart runs)
	$(BIN)/pytest

test-slow:  ## a real S3 server, hard kills, separate executors, then the latency tier
	$(BIN)/pytest -m "seaweedfs or chaos or cluster"
	$(BIN)/pytest -m latency

bench:  ## benchmarks: print figures, assert nothing about time
	$(BIN)/pytest -m bench -s

ci:  ## what CI runs on a clean clone
	bash .ci/run
