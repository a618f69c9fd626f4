"""A mkdocs hook: what Material's ``offline`` plugin does for a site opened from the file system,
without the script it adds from a CDN. Material's search reads ``search/search_index.js`` when the
page is a ``file://`` one (a browser refuses it the JSON there): this writes it beside the JSON. Its
search runs in a Web Worker, which a ``file://`` page may not start (Chromium refuses the script to
origin ``null``, and the box stays at "Initializing search"): ``file-worker.js``, loaded before
Material's bundle, gives such pages a Worker that runs the script in a hidden iframe."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

SHIM = Path(__file__).resolve().parent / "file-worker.js"
SHIM_URL = "assets/javascripts/file-worker.js"


def on_config(config: Any, **kwargs: Any) -> Any:
    polyfills = config.extra.setdefault("polyfills", [])
    if SHIM_URL not in polyfills:
        polyfills.append(SHIM_URL)
    return config


@event_priority(-100)  # after the search plugin has written its index
def on_post_build(config: Any, **kwargs: Any) -> None:
    site = Path(config.site_dir)
    shutil.copyfile(SHIM, site / SHIM_URL)
    index = site / "search" / "search_index.json"
    if index.is_file():
        index.with_suffix(".js").write_text(
            f"var __index = {index.read_text(encoding='utf-8')}", encoding="utf-8"
        )
