"""Graph helpers shared by the DOT and HTML renderers: edges, device colours, a layered layout."""

from __future__ import annotations

from typing import Any

HOST_COLOR = "#d9d9d9"
#: fill colours for targets, in target order (light enough for black text)
PALETTE = ["#8ecae6", "#ffb703", "#90be6d", "#f4978e", "#cdb4db", "#a8dadc", "#f9c74f", "#b5e48c", "#ffafcc",
           "#bde0fe"]


def device_colors(data: dict[str, Any]) -> dict[str, str]:
    """Device -> fill colour; ``host`` is grey, targets follow :data:`PALETTE`."""
    colors = {}
    for dev in data["totals"]["by_device"]:
        if dev == "host":
            colors[dev] = HOST_COLOR
        else:
            colors[dev] = PALETTE[(len(colors) - ("host" in colors)) % len(PALETTE)]
    return colors


def edges(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(producer node, consumer node, value name)`` for every value flowing between nodes."""
    producer = {}
    for n in data["nodes"]:
        for v in n["outputs"]:
            producer[v] = n["name"]
    out, seen = [], set()
    for n in data["nodes"]:
        for v in n["inputs"]:
            src = producer.get(v)
            if src is not None and src != n["name"] and (src, n["name"], v) not in seen:
                seen.add((src, n["name"], v))
                out.append((src, n["name"], v))
    return out


def layered_layout(data: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Node -> ``(layer, slot)``: layer = longest path from a source; slots ordered by the mean
    slot of the node's predecessors (one barycentre sweep), so chains stay straight."""
    names = [n["name"] for n in data["nodes"]]
    order = {name: i for i, name in enumerate(names)}
    preds: dict[str, list[str]] = {name: [] for name in names}
    for src, dst, _ in edges(data):
        preds[dst].append(src)
    layer: dict[str, int] = {}
    remaining = list(names)
    # records are in topological order, but be robust to any order: iterate to a fixed point
    for _ in range(len(names) + 1):
        progressed, pending = False, []
        for name in remaining:
            if all(p in layer for p in preds[name]):
                layer[name] = 1 + max((layer[p] for p in preds[name]), default=-1)
                progressed = True
            else:
                pending.append(name)
        remaining = pending
        if not remaining or not progressed:
            break
    for name in remaining:  # a cycle cannot happen in a valid model; place leftovers last
        layer[name] = 1 + max(layer.values(), default=-1)
    by_layer: dict[int, list[str]] = {}
    for name in names:
        by_layer.setdefault(layer[name], []).append(name)
    slot: dict[str, float] = {}
    result = {}
    for k in sorted(by_layer):
        members = by_layer[k]

        def key(name: str) -> tuple[float, int]:
            ps = [slot[p] for p in preds[name] if p in slot]
            return (sum(ps) / len(ps) if ps else float("inf"), order[name])

        members.sort(key=key)
        for i, name in enumerate(members):
            slot[name] = i
            result[name] = (k, i)
    return result


__all__ = ["HOST_COLOR", "PALETTE", "device_colors", "edges", "layered_layout"]
