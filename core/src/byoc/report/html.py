"""One self-contained HTML page: inline CSS, JS and SVG, no external resource of any kind.

The report data, the device colours, the graph edges and a layered layout are embedded as one
JSON document (``<script type="application/json">``); the page's script renders the totals,
the graph (nodes coloured by device, regions as dashed boxes) and a filterable node table.
After rendering it appends ``<div id="byoc-ok">``; any script error is written into
``<pre id="byoc-errors">`` so that a headless browser can check the page.

Without JavaScript the page still reads: a ``<noscript>`` block holds static tables (totals per
device, every node with its device, region, pattern and reason, every region), rendered here
with every name escaped.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from typing import Any

from byoc.report.flops import format_flops
from byoc.report.graph import device_colors, edges, layered_layout

PLACEHOLDER = "__BYOC_PAYLOAD__"
NOSCRIPT = "__BYOC_NOSCRIPT__"


def _template() -> str:
    return resources.files("byoc.report").joinpath("template.html").read_text(encoding="utf-8")


def _script_json(payload: Any) -> str:
    """JSON that is safe inside a ``<script>`` element (no ``</script>``, ``<!--``)."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _html_table(table_id: str, headers: list[str], rows: list[list[Any]], numeric: set[int] = frozenset()) -> str:
    def cell(tag: str, i: int, value: Any) -> str:
        cls = ' class="num"' if i in numeric else ""
        return f"<{tag}{cls}>{_esc(value)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "\n".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f'<table id="{table_id}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>'


def _why(node: dict[str, Any]) -> str:
    """Why a node is where it is (empty when a target took it)."""
    if node.get("fallback"):
        return f"fallback: {node['fallback']}"
    if node.get("rule"):
        return f"dropped by rule {node['rule']}"
    if node["device"] != "host":
        return ""
    reasons = [f"{t}: {r}" for t, r in node.get("verdicts", {}).items() if r]
    return "; ".join(reasons)


def render_noscript(data: dict[str, Any]) -> str:
    """Static tables for a browser without JavaScript (all text escaped)."""
    totals = data["totals"]
    parts = ['<p class="muted">JavaScript is off: the interactive graph is not shown; the tables below are '
             'static.</p>', "<h2>Totals</h2>"]
    rows = [[dev, t["nodes"], t["regions"] if dev != "host" else "-", format_flops(t["flops"]),
             f"{100 * t['flops_share']:.1f}%"] for dev, t in totals["by_device"].items()]
    rows.append(["total", totals["nodes"], totals["regions"], format_flops(totals["flops"]),
                 "100.0%" if totals["flops"] else "0.0%"])
    parts.append(_html_table("byoc-static-totals", ["device", "nodes", "regions", "FLOPs", "share of FLOPs"], rows,
                             {1, 2, 3, 4}))
    parts.append(f"<h2>Nodes ({len(data['nodes'])})</h2>")
    rows = [[i + 1, (n["scope"] + "/" if n["scope"] else "") + n["name"], n["op_type"], n["device"],
             n["region"] or "", n["pattern"] or "", "" if n["flops"] is None else format_flops(n["flops"]), _why(n)]
            for i, n in enumerate(data["nodes"])]
    parts.append(_html_table("byoc-static-nodes", ["#", "node", "op", "device", "region", "pattern", "FLOPs", "why"],
                             rows, {0, 6}))
    parts.append(f"<h2>Regions ({len(data['regions'])})</h2>")
    rows = [[r["name"], r["target"], len(r["nodes"]), ", ".join(r["inputs"]), ", ".join(r["outputs"]),
             format_flops(r["flops"]), f"{r['artifact']['format']} ({r['artifact']['bytes']} bytes)",
             r["host_fallback"] or ""] for r in data["regions"]]
    parts.append(_html_table("byoc-static-regions", ["region", "target", "nodes", "inputs", "outputs", "FLOPs",
                                                     "artifact", "host fallback"], rows, {2, 5}))
    placement = data.get("placement")
    if placement:
        parts.append(f"<h2>Placement ({_esc(placement['mode'])})</h2>")
        rows = [[", ".join(d.get("regions") or []), d["target"], d["chosen"],
                 "; ".join(f"{a['plan']}: " + ("n/a" if a["seconds"] is None else f"{a['seconds'] * 1e3:.3f} ms")
                           + f" ({a['source']})" for a in d["alternatives"]), d["why"]]
                for d in placement["decisions"]]
        parts.append(_html_table("byoc-static-placement", ["regions", "target", "chosen", "alternatives", "why"],
                                 rows))
    faults = data.get("faults") or []
    if faults:
        parts.append(f"<h2>Plugin faults ({len(faults)})</h2><ul>"
                     + "".join(f'<li class="fault">{_esc(f.get("text", f))}</li>' for f in faults) + "</ul>")
    return "\n".join(parts)


def render_html(data: dict[str, Any]) -> str:
    layout = layered_layout(data)
    payload = {
        "data": data,
        "colors": device_colors(data),
        "edges": [[src, dst] for src, dst, _ in edges(data)],
        "layout": {name: list(pos) for name, pos in layout.items()},
    }
    template = _template()
    if template.count(PLACEHOLDER) != 1 or template.count(NOSCRIPT) != 1:  # pragma: no cover - packaging error
        raise RuntimeError("byoc/report/template.html is damaged: a placeholder is missing")
    # one pass over the template: text put in for one placeholder is never searched for the other
    values = {PLACEHOLDER: _script_json(payload), NOSCRIPT: render_noscript(data)}
    return re.sub(f"{PLACEHOLDER}|{NOSCRIPT}", lambda m: values[m.group(0)], template)


__all__ = ["render_html"]
