"""The ``byoc`` command."""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np

from byoc.errors import ByocError, InputError
from byoc.frontend.shapes import add_shape_argument, parse_shape_args


def _load_npy(path: str, name: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"input {name!r}: file not found: {path}") from None
    except ValueError as exc:
        raise InputError(f"input {name!r}: {path} is not a plain .npy array ({exc})") from None


def _parse_inputs(pairs: list[str]) -> dict[str, np.ndarray]:
    feeds = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--input expects NAME=FILE.npy, got {pair!r}")
        feeds[name] = _load_npy(path, name)
    return feeds


def cmd_info(args: argparse.Namespace) -> int:
    import onnx_ir as ir

    from byoc.frontend import load_model
    from byoc.kernels import is_supported

    model = load_model(args.model, require_kernels=False)
    graph = model.graph
    print(f"model: {args.model}")
    print(f"opset: {dict(graph.opset_imports)}   ir_version: {model.ir_version}   producer: {model.producer_name or '-'}")
    print("inputs:")
    for v in graph.inputs:
        if v.name in graph.initializers:
            continue
        print(f"  {v.name}: {v.dtype.name if v.dtype else '?'} {_shape(v)}")
    print("outputs:")
    for v in graph.outputs:
        print(f"  {v.name}: {v.dtype.name if v.dtype else '?'} {_shape(v)}")
    counts: collections.Counter[str] = collections.Counter()
    supported: dict[str, bool] = {}
    unsupported = []
    for node in ir.traversal.RecursiveGraphIterator(graph):
        key = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
        counts[key] += 1
        supported.setdefault(key, is_supported(node.op_type, node.domain))
        if not supported[key]:
            unsupported.append(node.name or key)
    print(f"nodes: {sum(counts.values())}   initializers: {len(graph.initializers)}")
    print("operators:")
    for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        mark = "" if supported[op] else "   (unsupported)"
        print(f"  {op:<28} {n:>6}{mark}")
    if unsupported:
        print(f"unsupported nodes ({len(unsupported)}): {', '.join(unsupported[:20])}{' ...' if len(unsupported) > 20 else ''}")
        return 1
    return 0


def _shape(v) -> str:
    if v.shape is None:
        return "[?]"
    return "[" + ", ".join(str(d) if isinstance(d, int) else (str(d.value) if d.value else "?") for d in v.shape) + "]"


def cmd_run(args: argparse.Namespace) -> int:
    import byoc
    from byoc.runtime.bundle import is_bundle

    feeds = _parse_inputs(args.input or [])
    if is_bundle(args.model):
        if args.target is not None:
            raise InputError(f"{args.model} is a bundle: its targets were fixed when it was compiled; drop --target")
        if args.shape:
            raise InputError(f"{args.model} is a bundle: its input shapes were fixed when it was compiled; drop --shape")
        compiled = byoc.load(args.model, fallback="host" if args.host_fallback else None)
    else:
        compiled = byoc.compile(args.model, targets=args.target if args.target is not None else None,
                                input_shapes=parse_shape_args(args.shape))
    outputs = compiled.run(feeds)
    out_dir = Path(args.output_dir) if args.output_dir else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    for name, arr in outputs.items():
        stats = f"min {arr.min():.6g} max {arr.max():.6g} mean {arr.mean():.6g}" if arr.size and arr.dtype.kind in "fiu" else ""
        print(f"{name}: {arr.dtype} {list(arr.shape)} {stats}")
        if out_dir is not None:
            target = out_dir / (_safe_filename(name) + ".npy")
            np.save(target, arr, allow_pickle=False)
            print(f"  -> {target}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    import byoc

    out = Path(args.output) if args.output else Path(args.model).with_suffix(".byoc")
    targets = [] if args.host_only else args.target
    compiled = byoc.compile(args.model, targets=targets, input_shapes=parse_shape_args(args.shape))
    compiled.save(out)
    placed = collections.Counter(rec.device for rec in compiled.records.values())
    print(f"regions: {len(compiled.regions)}   nodes: " + ", ".join(f"{d} {n}" for d, n in sorted(placed.items())))
    for fault in compiled.faults:
        print(f"fallback: {fault}")
    print(f"bundle: {out} ({out.stat().st_size} bytes)")
    return 0


def _safe_filename(name: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".")
    return keep or "output"


def build_parser() -> argparse.ArgumentParser:
    from byoc import __version__

    parser = argparse.ArgumentParser(prog="byoc", description="Bring Your Own Codegen: compile and run ONNX models.")
    parser.add_argument("--version", action="version", version=f"byoc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="inputs, outputs, operator counts and unsupported operators of a model")
    p.add_argument("model")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("compile", help="compile a model and save it as one bundle file (MODEL.byoc)")
    p.add_argument("model")
    p.add_argument("--output", "-o", metavar="FILE.byoc", help="the bundle to write (default: MODEL with suffix .byoc)")
    p.add_argument("--target", "-t", action="append", metavar="TARGET",
                   help="target to use, in priority order (repeat); default: every installed target")
    p.add_argument("--host-only", action="store_true", help="use no target: everything runs on the host")
    add_shape_argument(p)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="compile and run a model (or run a .byoc bundle) on .npy inputs")
    p.add_argument("model", help="an ONNX model, or a bundle written by `byoc compile`")
    p.add_argument("--host-fallback", action="store_true",
                   help="bundle only: run regions whose plugin is missing or of another version on the host")
    p.add_argument("--input", "-i", action="append", metavar="NAME=FILE.npy", help="an input (repeat for each)")
    p.add_argument("--output-dir", "-o", metavar="DIR", help="write each output as DIR/<name>.npy")
    p.add_argument("--target", "-t", action="append", metavar="TARGET",
                   help="target to use, in priority order (repeat); default: every installed target")
    add_shape_argument(p)
    p.set_defaults(func=cmd_run)

    from byoc.report.commands import add_commands  # explain, partition, targets, doctor

    add_commands(sub)
    from byoc.testing.commands import add_commands as add_testing_commands  # conformance, new-plugin

    add_testing_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ByocError as exc:
        print(f"byoc: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
