"""Graphviz DOT: nodes filled by device, each region a cluster, model inputs/outputs as ellipses."""

from __future__ import annotations

from typing import Any

from byoc.report.flops import format_flops
from byoc.report.graph import device_colors, edges


def _q(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _label(*parts: str) -> str:
    return '"' + "\\n".join(p.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") for p in parts) + '"'


def render_dot(data: dict[str, Any]) -> str:
    colors = device_colors(data)
    lines = [
        "digraph byoc {",
        "  rankdir=TB;",
        '  graph [fontname="Helvetica", fontsize=10, label="byoc placement", labelloc=t];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=9, penwidth=1];',
        '  edge [color="#777777", arrowsize=0.6];',
    ]

    def node_line(n: dict[str, Any], indent: str) -> str:
        attrs = [f"label={_label(n['name'], n['op_type'] + (' | ' + n['pattern'] if n['pattern'] else ''))}",
                 f"fillcolor={_q(colors.get(n['device'], '#ffffff'))}"]
        tip = [f"device: {n['device']}", f"flops: {format_flops(n['flops'])}"]
        tip += [f"{t}: {'ok' if r is None else r}" for t, r in n["verdicts"].items()]
        if n["rule"]:
            tip.append(f"dropped by {n['rule']}")
            attrs.append('style="rounded,filled,dashed"')
        if n["fallback"]:
            tip.append(f"fallback: {n['fallback']}")
            attrs += ['color="#d00000"', "penwidth=2"]
        attrs.append(f"tooltip={_q(chr(10).join(tip))}")
        return f"{indent}{_q(n['name'])} [{', '.join(attrs)}];"

    by_region: dict[str, list[dict[str, Any]]] = {}
    for n in data["nodes"]:
        if n["region"]:
            by_region.setdefault(n["region"], []).append(n)
    targets = {r["name"]: r["target"] for r in data["regions"]}
    for k, (region, members) in enumerate(by_region.items()):
        target = targets.get(region, members[0]["device"])
        lines.append(f"  subgraph {_q('cluster_' + str(k) + '_' + region)} {{")
        lines.append(f"    label={_q(f'{region} ({target})')}; style=\"rounded,dashed\"; "
                     f"color={_q(colors.get(target, '#000000'))};")
        lines.extend(node_line(n, "    ") for n in members)
        lines.append("  }")
    for n in data["nodes"]:
        if not n["region"]:
            lines.append(node_line(n, "  "))

    producer = {v: n["name"] for n in data["nodes"] for v in n["outputs"]}
    consumers: dict[str, list[str]] = {}
    for n in data["nodes"]:
        for v in n["inputs"]:
            consumers.setdefault(v, []).append(n["name"])
    for v in data["model"]["inputs"]:
        io = f"byoc:input:{v['name']}"
        lines.append(f"  {_q(io)} [shape=ellipse, style=filled, fillcolor=\"#ffffff\", label={_label(v['name'])}];")
        for c in dict.fromkeys(consumers.get(v["name"], [])):
            lines.append(f"  {_q(io)} -> {_q(c)};")
    for v in data["model"]["outputs"]:
        io = f"byoc:output:{v['name']}"
        lines.append(f"  {_q(io)} [shape=ellipse, style=filled, fillcolor=\"#ffffff\", label={_label(v['name'])}];")
        if v["name"] in producer:
            lines.append(f"  {_q(producer[v['name']])} -> {_q(io)};")
    for src, dst, value in edges(data):
        lines.append(f"  {_q(src)} -> {_q(dst)} [tooltip={_q(value)}];")

    legend = " | ".join(f"{dev}" for dev in colors)
    lines.append(f"  {_q('byoc:legend')} [shape=plaintext, style=\"\", label={_label('devices: ' + legend)}];")
    for dev, color in colors.items():
        lines.append(f"  {_q('byoc:legend:' + dev)} [shape=box, fillcolor={_q(color)}, label={_label(dev)}];")
        lines.append(f"  {_q('byoc:legend')} -> {_q('byoc:legend:' + dev)} [style=invis];")
    lines.append("}")
    return "\n".join(lines) + "\n"


__all__ = ["render_dot"]
