"""One self-contained HTML page: inline CSS, JS and SVG, no external resource of any kind.

The report data, the device colours, the graph edges and a layered layout are embedded as one
JSON document (``<script type="application/json">``); the page's script renders the totals,
the graph (nodes coloured by device, regions as dashed boxes) and a filterable node table.
After rendering it appends ``<div id="byoc-ok">``; any script error is written into
``<pre id="byoc-errors">`` so that a headless browser can check the page.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from byoc.report.graph import device_colors, edges, layered_layout

PLACEHOLDER = "__BYOC_PAYLOAD__"


def _template() -> str:
    return resources.files("byoc.report").joinpath("template.html").read_text(encoding="utf-8")


def _script_json(payload: Any) -> str:
    """JSON that is safe inside a ``<script>`` element (no ``</script>``, ``<!--``)."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def render_html(data: dict[str, Any]) -> str:
    layout = layered_layout(data)
    payload = {
        "data": data,
        "colors": device_colors(data),
        "edges": [[src, dst] for src, dst, _ in edges(data)],
        "layout": {name: list(pos) for name, pos in layout.items()},
    }
    template = _template()
    if template.count(PLACEHOLDER) != 1:  # pragma: no cover - packaging error
        raise RuntimeError("byoc/report/template.html is damaged: payload placeholder missing")
    return template.replace(PLACEHOLDER, _script_json(payload))


__all__ = ["render_html"]
