# kvfast: every set-up step lives here; .ci/run calls `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo install dev browser test test-rust test-python lint fmt docs docs-serve bench fuzz clean

# Install kvfast (no extras) and print the structure of the bundled sample state.
demo: $(PY)
	$(PIP) install -q .
	$(VENV)/bin/kvfast info

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Build the extension (release) and install it with its test tools, the documentation's tools,
# matplotlib, Ray Data and llama-cpp-python (built from source: about 6 minutes on 2 cores the first time, then pip's
# wheel cache makes it instant on the same machine); constraints.txt holds the packages pip would
# otherwise backtrack through for tens of minutes.
install: $(PY)
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(PIP) install -q -c constraints.txt '.[test,plot,probe,ray,s3,docs]'

# The developer loop: rebuild the extension (release) into python/kvfast/ and point the venv at
# python/, so Python edits are live and a Rust edit needs only `make dev` again (after `make install`).
EXT = $(shell $(PY) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
SITE = $(shell $(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
dev: $(PY)
	cargo build --release -q -p kvfast-py --features pyo3/extension-module
	cp target/release/lib_kvfast.so python/kvfast/_kvfast$(EXT)
	rm -rf $(SITE)/kvfast
	echo "$(CURDIR)/python" > $(SITE)/kvfast-dev.pth

# The whole test suite: Rust unit tests, lint and type checks, Python tests (which run every example
# of README.md and docs/, and build the documentation site strictly: tests/test_docs.py).
test: install browser test-rust lint test-python

# Headless Chromium (Debian's package) for the browser tests: the HTML attention view, the site's
# search from file://; make test (KVFAST_REQUIRE_PROBE=1) requires it.
browser:
	command -v chromium >/dev/null || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)

# The core's tests and the binding's: kvfast-py's test binary links because pyo3's
# extension-module feature is turned on by maturin alone (pyproject's [tool.maturin] features),
# never in Cargo.toml.
test-rust:
	cargo test --workspace

test-python:
	cd tests && KVFAST_REQUIRE_PROBE=1 ../$(PY) -m pytest -q ..

lint:
	cargo fmt --check
	cargo clippy --all-targets -q -- -D warnings
	$(VENV)/bin/ruff check python tests benches examples docs
	$(VENV)/bin/ruff format --check python tests benches examples docs
	$(VENV)/bin/mypy
	cd tests && ../$(PY) -m mypy.stubtest kvfast._kvfast --allowlist stubtest-allowlist.txt

# The documentation site, built strictly (a broken link, reference or any warning fails) into
# site/ (gitignored; open site/index.html), and served locally with a rebuild on every edit.
# The build draws the pictures (docs/hooks/pictures.py) with the kvfast of $(VENV).
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

fmt:
	cargo fmt
	$(VENV)/bin/ruff format python tests benches examples docs

bench: install
	$(PY) benches/bench_values.py
	$(PY) benches/bench_stats.py
	$(PY) benches/bench_export.py
	$(PY) benches/bench_long.py
	$(PY) benches/bench_open.py
	$(PY) benches/bench_open_rotation.py
	$(PY) benches/bench_rotation.py
	$(PY) benches/bench_remote.py
	$(PY) benches/bench_write_memory.py
	$(PY) benches/bench_attention.py
	$(PY) benches/bench_capture.py

# Coverage-guided fuzzing of the core under AddressSanitizer (cargo-fuzz, libFuzzer): each target
# in turn for FUZZ_SECONDS, its corpus seeded from tests/data (fuzz/corpus, kept between runs, not
# in git). Not part of `make test`. Needs `cargo install cargo-fuzz`; runs on stable Rust (cargo-fuzz
# asks for nightly flags, which RUSTC_BOOTSTRAP=1 allows). A failing input lands in
# fuzz/artifacts/<target>/: copy it to rust/kvfast-core/tests/fuzz-inputs/<target>/ for the test suite.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= open decode stats quantize compare
fuzz:
	python3 fuzz/seed.py
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		RUSTC_BOOTSTRAP=1 cargo fuzz run -s address $$t corpus/$$t -- \
			-max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 || exit 1; \
	done

clean:
	rm -rf $(VENV) target
