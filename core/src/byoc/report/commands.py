"""``byoc explain``, ``byoc partition``, ``byoc targets`` and ``byoc doctor``.

:func:`add_commands` adds them to the ``byoc`` command's sub-parsers (see :mod:`byoc.cli`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from byoc.contract.folders import atomic_write
from byoc.errors import ByocError, InputError

#: above this size a partitioned model is written with its tensors as external data
_PROTO_LIMIT = 1_800_000_000


def _targets_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", "-t", action="append", metavar="TARGET",
                   help="target to use, in priority order (repeat); default: every available target")
    p.add_argument("--placement", choices=["priority", "cost", "measure"], default="priority",
                   help="priority (default): each target in turn takes what it supports; cost: every node where "
                        "the estimates say the whole model runs fastest; measure: each region timed on its target, on the "
                        "host and split, the fastest kept (times cached per machine); the report lists each "
                        "region's alternatives and why one won")
    from byoc.frontend.shapes import add_shape_argument

    add_shape_argument(p)  # --shape NAME=D1,D2,... (explain and partition)


def _compile(args: argparse.Namespace):
    from byoc.cliutil import compile_or_load

    # a bundle's region whose plugin is missing runs on the host; the report shows it as a fallback
    return compile_or_load(args, strict=args.strict, host_fallback=True)


def _write(dest: str, text: str, what: str) -> None:
    if dest == "-":
        sys.stdout.write(text)
        return
    try:
        atomic_write(Path(dest), text.encode("utf-8"))
    except OSError as exc:
        raise InputError(f"cannot write the {what} report to {dest}: {exc.strerror or exc}") from None


def cmd_explain(args: argparse.Namespace) -> int:
    from byoc.report import render

    from byoc.cliutil import check_distinct, check_output_file

    outputs = [(fmt, dest) for fmt, dest in (("json", args.json), ("dot", args.dot), ("html", args.html)) if dest]
    if sum(dest == "-" for _, dest in outputs) > 1:
        raise InputError("only one of --json/--dot/--html can write to stdout ('-')")
    for fmt, dest in outputs:  # before any work
        check_output_file(dest, f"--{fmt}", allow_stdout=True, force=args.force)
    check_distinct([(f"--{fmt}", dest) for fmt, dest in outputs])
    compiled = _compile(args)
    data = compiled.report_data()
    to_stdout = any(dest == "-" for _, dest in outputs)
    if not to_stdout:
        sys.stdout.write(render(data, "text"))
        if getattr(args, "show_code", False):
            sys.stdout.write(_region_code(compiled))
    for fmt, dest in outputs:
        _write(dest, render(data, fmt), fmt)
        if dest != "-":
            print(f"{fmt}: {dest}", file=sys.stderr)
    return 0


def _region_code(compiled: Any) -> str:
    """Each region's generated source, where its artifact carries one (``metadata["source"]``, or
    the artifact's bytes when its format is ``"python"``)."""
    parts = []
    for cr in compiled.regions:
        art = cr.artifact
        source = art.metadata.get("source")
        if not isinstance(source, str) and art.format == "python":
            source = bytes(art.data).decode("utf-8", errors="replace")
        if not isinstance(source, str):
            parts.append(f"\n== region {cr.region.name} (target {cr.region.target}, format {art.format}): "
                         f"no source in its artifact\n")
            continue
        parts.append(f"\n== region {cr.region.name} (target {cr.region.target}, format {art.format}) ==\n")
        parts.append(source if source.endswith("\n") else source + "\n")
    return "".join(parts) if parts else "\n(no regions: everything runs on the host)\n"


def cmd_partition(args: argparse.Namespace) -> int:
    import onnx

    from byoc.cliutil import check_output_file
    from byoc.report import partitioned_onnx

    check_output_file(args.output, "--output", force=args.force)
    compiled = _compile(args)
    proto = partitioned_onnx(compiled)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:  # pragma: no cover - would be a byoc bug
        raise ByocError(f"the partitioned model does not pass the ONNX checker: {exc}") from None
    out = Path(args.output)
    if proto.ByteSize() > _PROTO_LIMIT:
        check_output_file(str(out) + ".data", "--output's external data", force=args.force)
    try:
        if proto.ByteSize() > _PROTO_LIMIT:
            onnx.save_model(proto, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=out.name + ".data")
        else:
            onnx.save_model(proto, str(out))
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror or exc}") from None
    data = compiled.report_data()
    by_dev = data["totals"]["by_device"]
    placed = ", ".join(f"{dev} {d['nodes']}" for dev, d in by_dev.items() if d["nodes"])
    print(f"wrote {out}: {len(compiled.regions)} region node(s) (domain 'byoc', op 'Region', body graph attribute "
          f"'body'); nodes: {placed}")
    for fault in compiled.faults:
        print(f"fallback: {fault}")
    return 0


def _target_rows(registry: Any) -> list[dict[str, Any]]:
    rows = []
    for t in registry.ordered_targets():
        rows.append({
            "name": t.name,
            "version": t.version,
            "distribution": t.distribution or "-",
            "device": t.device,
            "operators": len(registry.operators.get(t.name, {})),
            "patterns": len(registry.patterns.get(t.name, [])),
            "rules": len(registry.rules.get(t.name, [])),
            "runtime_path": t.runtime_path or "-",
            # evaluated now (lazily): byoc.compile(model) with targets=None uses only these
            "available": t.is_available(),
            "plugin": t.plugin,
            "priority": t.priority,
            "description": t.description,
            "options": [o.describe() for o in t.options],
        })
    return rows


def cmd_targets(args: argparse.Namespace) -> int:
    from byoc.plugins import get_registry
    from byoc.report.text import _table

    registry = get_registry()
    rows = _target_rows(registry)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no targets installed: everything runs on the host (pip install a byoc plugin, e.g. byoc-cpu)")
    else:
        cols = ["name", "version", "distribution", "device", "operators", "patterns", "rules", "runtime_path",
                "available", "description"]
        heads = ["target", "version", "distribution", "device", "#operators", "#patterns", "#rules", "runtime path",
                 "available", "description"]
        lines = _table(heads, [[str(r[c]) for c in cols] for r in rows], {4, 5, 6}, indent="")
        print("\n".join(lines))
        absent = [r["name"] for r in rows if not r["available"]]
        if absent:
            print(f"\nnot available here (device absent; run only when named, e.g. targets=[{absent[0]!r}]): "
                  f"{', '.join(absent)}")
    unusable = sorted(set(registry.conflicts) | set(registry.incompatible))
    if unusable:
        print(f"\nunusable targets: {', '.join(unusable)} (run `byoc doctor`)")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    import byoc

    found = byoc.doctor()
    if getattr(args, "json", False):
        print(json.dumps(found.to_json(), indent=2))
    else:
        sys.stdout.write(found.format())
    return 0 if found.ok else 1


def add_commands(sub: Any) -> None:
    """Add ``explain``, ``partition``, ``targets`` and ``doctor`` to the ``byoc`` sub-parsers."""
    from byoc.cliutil import add_calibration_args

    p = sub.add_parser("explain", help="the placement report: where every node runs and why")
    p.add_argument("model", help="an ONNX model (or a .byoc bundle)")
    _targets_arg(p)
    p.add_argument("--json", metavar="FILE|-", help="also write the report as JSON ('-': stdout, no table)")
    p.add_argument("--dot", metavar="FILE|-", help="also write the graph as Graphviz DOT")
    p.add_argument("--html", metavar="FILE|-", help="also write one self-contained HTML page")
    p.add_argument("--strict", action="store_true", help="fail on a plugin fault instead of falling back")
    p.add_argument("--force", action="store_true", help="overwrite existing --json/--dot/--html files")
    p.add_argument("--show-code", action="store_true",
                   help="also print each region's generated source (artifacts that carry one)")
    add_calibration_args(p)
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("partition", help="write the partitioned model as ONNX (regions as byoc::Region nodes)")
    p.add_argument("model", help="an ONNX model (or a .byoc bundle)")
    _targets_arg(p)
    p.add_argument("--output", "-o", required=True, metavar="OUT.onnx", help="the ONNX file to write")
    p.add_argument("--force", action="store_true", help="overwrite an existing --output file")
    p.add_argument("--strict", action="store_true", help="fail on a plugin fault instead of falling back")
    add_calibration_args(p)
    p.set_defaults(func=cmd_partition)

    p = sub.add_parser("targets", help="installed targets: version, distribution, device, operators, runtime")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_targets)

    p = sub.add_parser("doctor", help="check the installed plugins (exit 1 on broken, duplicate or "
                                      "incompatible plugins)")
    p.add_argument("--json", action="store_true", help="print JSON (byoc.doctor().to_json())")
    p.set_defaults(func=cmd_doctor)


__all__ = ["add_commands", "cmd_doctor", "cmd_explain", "cmd_partition", "cmd_targets"]
