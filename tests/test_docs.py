"""The documentation as a reader meets it: every Python block of README.md and docs/**/*.md runs
alone, as written, in a fresh interpreter, from a folder that has the repository's tests/data (the
paths the examples name); every shell block too, with this environment's `kvfast` on PATH; and
the site builds with `mkdocs build --strict`, offline, with every public name in its reference.

A block that cannot run here has `<!-- not run: why -->` on the line before its fence: they are
counted, so that they cannot grow silently."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from s3_server import moto_s3

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(
    r"^(?:<!--\s*not run:(?P<why>[^\n]*?)-->\n)?```(?P<lang>[^\n`]*)\n(?P<body>.*?)^```$",
    re.DOTALL | re.MULTILINE,
)
#: blocks the test suite cannot run (a server left running, a shell's own environment, make itself,
#: pip building llama-cpp-python (for the CPU, or with CUDA), a GGUF of the reader's own, minutes of llama.cpp decoding)
NOT_RUN = 10
#: the bucket the object-storage examples read: moto's S3 server, the states of this folder
BUCKET, BUCKET_STATES = "kvfast-docs/runs", ROOT / "tests/data/qwen3tiny-f16-fa"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    not_run: str | None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks() -> list[Block]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start("lang")) + 1
            why = m.group("why")
            out.append(Block(page, line, m.group("lang").strip(), m.group("body"), why and why.strip()))
    return out


BLOCKS = _blocks()
PYTHON = [b for b in BLOCKS if b.lang == "python" and b.not_run is None]
SHELL = [b for b in BLOCKS if b.lang == "sh" and b.not_run is None]


def test_the_blocks_are_all_found() -> None:
    """Every fence of a page is a block (none hidden by a fence the pattern missed), each Python or
    shell block runs or says why not, and the ones that do not run are the ones counted."""
    for page in PAGES:
        fences = sum(1 for line in page.read_text().splitlines() if line.startswith("```"))
        assert fences == 2 * sum(1 for b in BLOCKS if b.page == page), page
    assert {b.lang for b in BLOCKS} <= {"python", "sh", "text"}
    not_run = [b.name for b in BLOCKS if b.not_run is not None]
    assert len(not_run) == NOT_RUN, not_run
    assert all(b.not_run for b in BLOCKS if b.not_run is not None), "say why a block is not run"
    assert len(PYTHON) >= 15 and len(SHELL) >= 4


@pytest.fixture()
def reader_folder(tmp_path: Path) -> Path:
    """An empty folder with the repository's tests/data in it, as a reader's clone has."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "data").symlink_to(ROOT / "tests" / "data")
    return tmp_path


def _env(extra: dict[str, str]) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "MPLBACKEND": "Agg", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **extra}


def _needs_s3(block: Block) -> bool:
    return "s3://" in block.body or 'filesystem("s3")' in block.body


def _run(block: Block, folder: Path, argv: list[str]) -> None:
    extra: dict[str, str] = {}
    if not _needs_s3(block):
        r = subprocess.run(argv, cwd=folder, env=_env(extra), capture_output=True, text=True, check=False)
    else:
        import fsspec

        with moto_s3() as aws:
            extra.update(aws)
            os.environ.update(aws)  # for this process's fsspec, which puts the states in the bucket
            try:
                fs = fsspec.filesystem("s3", skip_instance_cache=True)
                fs.makedirs(BUCKET, exist_ok=True)
                for p in sorted(BUCKET_STATES.iterdir()):
                    if p.suffix in (".bin", ".ggsq", ".ggsn"):
                        fs.put(str(p), f"{BUCKET}/{p.name}")
                r = subprocess.run(
                    argv, cwd=folder, env=_env(extra), capture_output=True, text=True, check=False
                )
            finally:
                for k in aws:
                    os.environ.pop(k, None)
    assert r.returncode == 0, f"{block.name} failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    assert r.stdout.strip(), f"{block.name} prints nothing"


@pytest.mark.parametrize("block", PYTHON, ids=[b.name for b in PYTHON])
def test_python_block_runs_alone(block: Block, reader_folder: Path) -> None:
    pytest.importorskip("matplotlib")
    script = reader_folder / "example.py"
    script.write_text(block.body)
    _run(block, reader_folder, [sys.executable, str(script)])


@pytest.mark.parametrize("block", SHELL, ids=[b.name for b in SHELL])
def test_shell_block_runs(block: Block, reader_folder: Path) -> None:
    pytest.importorskip("matplotlib")
    _run(block, reader_folder, ["bash", "-euo", "pipefail", "-c", block.body])
    for png in re.findall(r"-o (\S+\.png)", block.body):  # the pictures a block draws are pictures
        assert (reader_folder / png).stat().st_size > 1000, png


# -- the site -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built strictly (any warning fails: a broken link, anchor or cross-reference)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        env=_env({"NO_MKDOCS_2_WARNING": "1", "KVFAST_TUTORIAL_GEMMA": "0"}),  # Gemma: test_notebook
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-8000:]
    return out


def test_the_site_builds_strictly_with_its_pictures(site: Path) -> None:
    pictures = ["layout.png", "heatmap.png", "stats.png", "diff-gemma3.png", "drift.png"]
    attention = ["attention-map.png", "attention-zoom.png", "attention-mass.png", "attention-view.html"]
    for png in pictures + attention:
        assert (site / "pictures" / png).stat().st_size > 5000, png
    shown = (site / "guide" / "pictures.html").read_text()
    assert all(f"../pictures/{png}" in shown for png in pictures[:4] + attention)
    assert '<iframe src="../pictures/attention-view.html"' in shown  # the interactive view, embedded


def test_the_site_searches_from_the_file_system(site: Path) -> None:
    """The README says to open site/index.html: from file:// Material's search worker cannot start
    (the box stayed at "Initializing search"); docs/hooks/offline.py's file-worker.js runs it. In
    headless Chromium, a query in the URL (Material's ?q=) lists the pages that match."""
    from browser import dump_dom

    dom = dump_dom((site / "index.html").resolve().as_uri() + "?q=heatmap")
    found = re.search(r'class="md-search-result__meta">([^<]*)<', dom)
    assert found is not None and re.fullmatch(r"\d+ matching documents", found.group(1)), found
    assert dom.count('class="md-search-result__item"') >= 2
    assert (site / "assets/javascripts/file-worker.js").is_file()


REMOTE = re.compile(
    r"""<(?:script|img|iframe|source)\b[^>]*\bsrc=["']?(?:https?:)?//"""
    r"""|<link\b[^>]*\bhref=["']?(?:https?:)?//[^>]*>"""
    r"""|url\(\s*["']?(?:https?:)?//""",
    re.IGNORECASE,
)


def test_the_site_fetches_nothing(site: Path) -> None:
    """No script, stylesheet, font or image comes from the internet: the site works offline."""
    found = []
    for f in site.rglob("*"):
        if f.suffix in (".html", ".css", ".js") and f.is_file():
            text = f.read_text(errors="replace")
            found += [f"{f.relative_to(site)}: {m.group(0)[:120]}" for m in REMOTE.finditer(text)]
            if f.suffix == ".css":
                assert "fonts.googleapis" not in text, f
    assert not found, found


def test_every_public_name_is_in_the_reference(site: Path) -> None:
    """Each name of each __all__ of kvfast and its subpackages (read from the sources by griffe, as
    the reference is) has its entry, an anchor named by its path, in the reference."""
    griffe = pytest.importorskip("griffe")
    pkg = griffe.load("kvfast", search_paths=[str(ROOT / "python")], resolve_aliases=False)
    ids: set[str] = set()
    for page in (site / "reference").glob("*.html"):
        ids.update(re.findall(r'\bid="([\w.]+)"', page.read_text()))
    missing = []

    def visit(mod: griffe.Module) -> None:
        if mod.name.startswith("_") and mod is not pkg:
            return
        for name in mod.exports or ():
            if f"{mod.path}.{name}" not in ids:
                missing.append(f"{mod.path}.{name}")
        for sub in mod.members.values():
            if not sub.is_alias and isinstance(sub, griffe.Module):
                visit(sub)

    visit(pkg)
    assert "kvfast.open" in ids and "kvfast.analysis.quant_error" in ids
    assert not missing, missing


def test_the_sphinx_roles_are_links(site: Path) -> None:
    """The docstrings' :class:/:func:/... roles are rendered as links, none left as text."""
    page = (site / "reference" / "kvfast.html").read_text()
    assert ":class:" not in page and ":func:" not in page and ":meth:" not in page
    assert re.search(r'<a [^>]*href="[^"]*#kvfast\.ClosedError"', page)
