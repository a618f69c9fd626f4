# kvfast: every set-up step lives here; .ci/run calls `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo install test test-rust test-python lint fmt bench clean

# Install kvfast (no extras) and print the structure of the bundled sample state.
demo: $(PY)
	$(PIP) install -q .
	$(VENV)/bin/kvfast info

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Build the extension (release) and install it with its test tools, matplotlib and
# llama-cpp-python (built from source: about 6 minutes on 2 cores the first time, then pip's
# wheel cache makes it instant on the same machine).
install: $(PY)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(PIP) install -q '.[test,plot,probe]'

# The whole test suite: Rust unit tests, lint and type checks, Python tests.
test: install test-rust lint test-python

test-rust:
	cargo test -p kvfast-core

test-python:
	cd tests && KVFAST_REQUIRE_PROBE=1 ../$(PY) -m pytest -q ..

lint:
	cargo fmt --check
	cargo clippy --all-targets -q -- -D warnings
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches
	$(VENV)/bin/mypy
	cd tests && ../$(PY) -m mypy.stubtest kvfast._kvfast --allowlist stubtest-allowlist.txt

fmt:
	cargo fmt
	$(VENV)/bin/ruff format python tests benches

bench: install
	$(PY) benches/bench_values.py
	$(PY) benches/bench_stats.py
	$(PY) benches/bench_export.py

clean:
	rm -rf $(VENV) target
