# Two commands do all set-up on a fresh machine (README.md):
#   make demo   - build gnl into .venv and run `gnl demo` (SQLite)
#   make test   - build, start the databases, lint, run every test (cargo test + pytest on
#                 SQLite, Postgres and MySQL)
# .ci/run calls `make test`.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.deps-stamp

.PHONY: demo test build deps services browser lint docs bench clean

$(STAMP): requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

deps: $(STAMP)

# maturin develop: builds the native module (release) and installs gnl (editable) + its deps,
# the studio extra included.
# PIP_QUIET: maturin's pip install of the dependencies printed a "Requirement already
# satisfied" line for each one on every build.
build: deps
	PIP_QUIET=1 $(VENV)/bin/maturin develop --release --quiet --extras studio

demo: build
	$(VENV)/bin/gnl demo

services:
	./scripts/services.sh

# Studio's browser tests drive Debian's Chromium (Playwright with executable_path, no browser
# download): installed here when /usr/bin/chromium is missing (sudo unless root).
browser:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; }

test: build services browser lint docs
	cargo test --quiet
	$(PY) -m pytest -q

lint: deps
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches
	$(VENV)/bin/mypy
	cargo fmt --check
	PYO3_PYTHON=$(abspath $(PY)) cargo clippy --all-targets --features python -- -D warnings

# The user guide (mkdocs.yml, docs/) into site/; --strict fails on any warning (a broken link or
# reference). Its Python examples run in the test suite (tests/test_guide.py).
docs: deps
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

bench: build
	$(PY) benches/bench_enqueue_sqlite.py
	$(PY) benches/bench_drain_sqlite.py

clean:
	rm -rf $(VENV) target site
