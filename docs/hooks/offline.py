"""A mkdocs hook: what Material's ``offline`` plugin does for a site opened from the file system,
without the script it adds from a CDN. Material's search reads ``search/search_index.js`` when the
page is a ``file://`` one (a browser refuses it the JSON there); this writes it beside the JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority


@event_priority(-100)  # after the search plugin has written its index
def on_post_build(config: Any, **kwargs: Any) -> None:
    index = Path(config.site_dir) / "search" / "search_index.json"
    if index.is_file():
        index.with_suffix(".js").write_text(
            f"var __index = {index.read_text(encoding='utf-8')}", encoding="utf-8"
        )
