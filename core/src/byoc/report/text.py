"""The terminal table: one aligned row per node, reasons as numbered notes, totals at the end.

Rejection reasons repeat (every ``MaxPool`` gets the same one), so the per-target verdict
columns show ``ok`` or ``no [k]`` and the reasons are listed once under the table; the output
stays readable for models of many hundred nodes.
"""

from __future__ import annotations

from typing import Any, Sequence

from byoc.report.flops import format_flops


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int] = frozenset(),
           indent: str = "  ") -> list[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def fmt(row: Sequence[str]) -> str:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(row)]
        return (indent + "  ".join(cells)).rstrip()

    lines = [fmt(headers), indent + "  ".join("-" * w for w in widths)]
    lines.extend(fmt(r) for r in rows)
    return lines


class _Notes:
    def __init__(self, prefix: str = ""):
        self.prefix = prefix
        self.items: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def ref(self, text: str) -> str:
        k = self.items.setdefault(text, len(self.items) + 1)
        self.counts[text] = self.counts.get(text, 0) + 1
        return f"[{self.prefix}{k}]"


def _shape(shape: list | None) -> str:
    if shape is None:
        return "[?]"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _placement_lines(placement: dict[str, Any] | None) -> list[str]:
    """Each region's alternatives with their times and why the chosen one won."""
    if not placement:
        return []
    head = f"Placement ({placement['mode']})"
    m = placement.get("measure")
    if m:
        head += (f": measured {m['measured']}, from cache {m['cached']}, estimated {m['estimated']}"
                 f" ({m['failed']} could not run); {m['spent_s']:.1f} s of a {m['budget_s']:g} s budget"
                 + (", budget spent: the rest are estimates" if m["budget_exhausted"] else ""))
    elif placement.get("total_s") is not None:
        head += f": estimated end-to-end {_ms(placement['total_s'])}"
    lines = ["", head + ":"]
    for d in placement["decisions"]:
        where = ", ".join(d.get("regions") or []) or "-"
        span = f" ({d['nodes']} nodes, {d['first_node']} .. {d['last_node']})" if "nodes" in d else ""
        lines.append(f"  {d['target']} region -> {where}{span}: chose {d['chosen']}")
        for a in d["alternatives"]:
            note = f"  [{a['note']}]" if a.get("note") else ""
            mark = "*" if a["plan"] == d["chosen"] else " "
            lines.append(f"    {mark} {a['plan']}: {_ms(a['seconds'])} {a['source']}{note}")
        lines.append(f"    why: {d['why']}")
    return lines


def _specialisation_lines(spec: dict | None) -> list[str]:
    if spec is None:
        return []
    names = ", ".join(spec["static_targets"])
    lines = ["", f"Static-shape targets ({names}) take part per input shape: the table above is the model for any "
                 f"shape; give the shapes (byoc.compile(..., input_shapes=...), --shape NAME=...) to place them now.",
             f"Specialisations compiled: {len(spec['compiled'])}" + (f"; input shapes refused: {spec['refused']}"
                                                                      if spec["refused"] else "")]
    preview = spec.get("preview")
    if preview:
        shapes = ", ".join(f"{n}={list(d)}" for n, d in preview["shapes"].items())
        if preview["error"]:
            lines.append(f"Placement at assumed input shapes {shapes}: not available ({preview['error']})")
        else:
            placed = ", ".join(f"{dev} {n}" for dev, n in preview["nodes"].items())
            lines.append(f"Placement at assumed input shapes {shapes} (a preview; each input shape is placed when "
                         f"first run): {len(preview['regions'])} region(s); nodes: {placed}")
            lines += [f"  {r['name']} -> {r['target']}: {r['nodes']} node(s), {r['first']} .. {r['last']}"
                      for r in preview["regions"]]
    for s in spec["compiled"]:
        shapes = ", ".join(f"{n}={d}" for n, d in s["shapes"].items())
        placed = ", ".join(f"{dev} {n}" for dev, n in s["nodes"].items())
        lines.append(f"  {shapes}: {s['regions']} region(s); nodes: {placed}")
    if spec.get("compiling"):
        shapes = ", ".join(f"{n}={d}" for n, d in spec["compiling"].items())
        lines.append(f"  {shapes}: compiling in the background (the base compile serves these shapes until then)")
    for f in spec.get("failed", ()):
        shapes = ", ".join(f"{n}={d}" for n, d in f["shapes"].items())
        lines.append(f"  {shapes}: failed in the background ({f['error']}); these shapes run on the base compile")
    return lines


def _first_tier_lines(tier: dict | None) -> list[str]:
    if tier is None:
        return []
    ready = tier["ready_after_s"]
    state = {"first": "not run yet", "compiling": "compiling in the background",
             "full": "serving" if ready is None else f"serving since {ready:.1f} s after the first run",
             "failed": f"failed ({tier['error']})"}[tier["state"]]
    return ["", "First tier: runs are answered by byoc's reference kernels (regions on the host) until the "
                f"compiled code serves; compiled code: {state}"]


def render_text(data: dict[str, Any]) -> str:
    nodes = data["nodes"]
    targets = [t["name"] for t in data["targets"]]
    extra = [t for n in nodes for t in n["verdicts"] if t not in targets]
    targets += list(dict.fromkeys(extra))
    totals = data["totals"]
    lines: list[str] = []
    tdesc = ", ".join(f"{t['name']} ({t['device']} {t['version']})" for t in data["targets"]) or "none (host only)"
    lines.append(f"byoc placement report: {totals['nodes']} nodes, {totals['regions']} regions; targets: {tdesc}")
    model = data["model"]
    ins = ", ".join(f"{v['name']} {v['dtype'] or '?'}{_shape(v['shape'])}" for v in model["inputs"])
    outs = ", ".join(f"{v['name']} {v['dtype'] or '?'}{_shape(v['shape'])}" for v in model["outputs"])
    lines.append(f"inputs: {ins or '-'}")
    lines.append(f"outputs: {outs or '-'}")
    lines.append("")

    reasons = _Notes()
    fallbacks = _Notes("F")
    rules = _Notes("R")
    any_fallback = any(n["fallback"] for n in nodes)
    any_scope = any(n.get("scope") for n in nodes)
    headers = ["#", "node"] + (["scope"] if any_scope else []) + ["op", "device", "region", "pattern", "flops"]
    headers += targets + ["rule"]
    if any_fallback:
        headers.append("fallback")
    rows = []
    for i, n in enumerate(nodes):
        op = n["op_type"] if n.get("domain") in (None, "", "ai.onnx") else f"{n['domain']}::{n['op_type']}"
        row = [str(i), n["name"]] + ([n.get("scope") or "-"] if any_scope else [])
        row += [op, n["device"], n["region"] or "-", n["pattern"] or "-", format_flops(n["flops"])]
        for t in targets:
            if t not in n["verdicts"]:
                row.append("-")
            elif n["verdicts"][t] is None:
                row.append("ok")
            else:
                row.append("no " + reasons.ref(n["verdicts"][t]))
        # the rule's name in the row, its full text (with the reason) once under the table
        row.append(f"{n['rule'].split(' (', 1)[0]} {rules.ref(n['rule'])}" if n["rule"] else "-")
        if any_fallback:
            row.append(fallbacks.ref(n["fallback"]) if n["fallback"] else "-")
        rows.append(row)
    right = {0, headers.index("flops")}
    lines.extend(_table(headers, rows, right, indent=""))

    if data["regions"]:
        lines += ["", f"Regions ({len(data['regions'])}):"]
        rrows = []
        for r in data["regions"]:
            pats = ", ".join(f"{p} x{c}" for p, c in sorted(r["patterns"].items())) or "-"
            target = r["target"] + (" (runs on host: fallback)" if r.get("host_fallback") else "")
            rrows.append([r["name"], target, str(len(r["nodes"])), format_flops(r["flops"]),
                          str(len(r["inputs"])), str(len(r["outputs"])), r["artifact"]["format"],
                          str(r["artifact"]["bytes"]), pats])
        lines.extend(_table(["region", "target", "nodes", "flops", "in", "out", "artifact", "bytes", "patterns"],
                            rrows, {2, 3, 4, 5, 7}))
        lines += [f"  {r['name']}: {r['note']}" for r in data["regions"] if r.get("note")]
    lines.extend(_placement_lines(data.get("placement")))
    if reasons.items:
        lines += ["", "Verdict reasons (node count):"]
        for text, k in reasons.items.items():
            lines.append(f"  [{k}] {text}  ({reasons.counts[text]})")
    if rules.items:
        lines += ["", "Dropped by partition rules (node count):"]
        for text, k in rules.items.items():
            lines.append(f"  [R{k}] {text}  ({rules.counts[text]})")
    if not fallbacks.items:
        lines += ["", "Host fallbacks: none"]
    else:
        lines += ["", "Host fallbacks (placed on a target, running on the host instead):"]
        for text, k in fallbacks.items.items():
            members = [n["name"] for n in nodes if n["fallback"] == text]
            lines.append(f"  [F{k}] {text}")
            lines.append(f"        nodes ({len(members)}): {', '.join(members)}")
    lines += _first_tier_lines(data.get("first_tier"))
    lines += _specialisation_lines(data.get("specialisations"))
    lines += ["", f"Plugin faults ({len(data['faults'])}):" if data["faults"] else "Plugin faults: none"]
    for f in data["faults"]:
        lines.append(f"  [{f['kind']}] {f['text']}")

    lines += ["", "Totals:"]
    kinds = {t["name"]: t["device"] for t in data["targets"]}
    trows = []
    for dev, d in totals["by_device"].items():
        trows.append([dev, kinds.get(dev, "cpu" if dev == "host" else "?"), str(d["nodes"]),
                      str(d["regions"]) if dev != "host" else "-", format_flops(d["flops"]),
                      f"{100 * d['flops_share']:.1f}%"])
    trows.append(["total", "", str(totals["nodes"]), str(totals["regions"]), format_flops(totals["flops"]),
                  "100.0%" if totals["flops"] else "0.0%"])
    lines.extend(_table(["device", "kind", "nodes", "regions", "flops", "share"], trows, {2, 3, 4, 5}))
    notes = []
    if totals["unknown_flops_nodes"]:
        notes.append(f"{totals['unknown_flops_nodes']} node(s) without static shapes count as 0 FLOPs")
    if totals["fallback_nodes"]:
        notes.append(f"{totals['fallback_nodes']} node(s) fell back to the host")
    if totals["dropped_nodes"]:
        notes.append(f"{totals['dropped_nodes']} node(s) were dropped by a rule")
    if notes:
        lines.append("  note: " + "; ".join(notes))
    return "\n".join(lines) + "\n"


__all__ = ["render_text"]
