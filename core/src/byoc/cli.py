"""The ``byoc`` command.

Every failure is one line on stderr (``byoc: error: ...``) and a non-zero exit status: 2 for bad
usage or input and byoc's own errors, 1 for a check that found problems (``doctor``,
``conformance``, ``info`` with unsupported operators), 3 for an unexpected error (a bug; the line
says so), 130 on Ctrl-C. ``--debug`` or ``BYOC_DEBUG=1`` also prints the traceback. Output paths
and names are checked before any work. Progress goes to stderr on a terminal (or with
``--progress``), never into pipes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import traceback
from pathlib import Path
from typing import NoReturn, Sequence

import numpy as np

from byoc.contract import environment as _env
from byoc.errors import ByocError, InputError
from byoc.frontend.shapes import add_shape_argument

EXIT_ERROR = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """A command-line mistake found by the parser: printed as one line, exit status 2."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse prints usage and two lines: we print one
        match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if match:
            from byoc.cliutil import suggest

            choices = re.findall(r"'([^']*)'", match.group(2))
            message = f"{message}{suggest(match.group(1), choices)}"
        raise UsageError(self.prog, message)


def _parse_inputs(items: list[str]) -> tuple[dict[str, np.ndarray], list[tuple[str, np.ndarray]]]:
    """Inputs given as ``NAME=FILE.npy`` (named) and as a bare ``FILE.npy`` (unnamed: they fill
    the model's inputs in order, see :func:`_assign_unnamed`); every file checked and read before
    any compile work."""
    from byoc.arrays import load_npy

    paths: dict[str, str] = {}
    bare: list[str] = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            bare.append(item)
            continue
        if not name or not path:
            raise InputError(f"an input is NAME=FILE.npy or FILE.npy, got {item!r}")
        if name in paths:
            raise InputError(f"input {name!r} given twice ({paths[name]} and {path})")
        paths[name] = path
    named = {name: load_npy(path, f"input {name!r} ({path})") for name, path in paths.items()}
    return named, [(path, load_npy(path, f"input file {path}")) for path in bare]


def _assign_unnamed(feeds: dict[str, np.ndarray], unnamed: list[tuple[str, np.ndarray]], names: list[str]) -> None:
    """Give each unnamed input file the model's next required input not given by name."""
    if not unnamed:
        return
    free = [n for n in names if n not in feeds]
    if len(unnamed) > len(free):
        files = [path for path, _ in unnamed]
        raise InputError(f"{len(unnamed)} input file(s) without a name ({', '.join(files)}) but the model has "
                         f"{len(free)} input(s) not given by name: {free}; name them: NAME=FILE.npy")
    for name, (_, arr) in zip(free, unnamed):
        feeds[name] = arr


def cmd_info(args: argparse.Namespace) -> int:
    import byoc
    from byoc.cliutil import check_model_path

    check_model_path(args.model)
    found = byoc.info(args.model)
    if args.json:
        print(json.dumps(found.to_json(), indent=2))
    else:
        sys.stdout.write(found.format())
    return 0 if found.supported else 1


def cmd_run(args: argparse.Namespace) -> int:
    from byoc.cliutil import check_output_dir, compile_or_load, is_bundle_path, model_io, safe_file_names
    from byoc.progress import phase

    if getattr(args, "ray", False):  # batch inference on a Ray cluster: byoc/ray.py
        from byoc.ray import run_cli

        if args.inputs:
            raise InputError(f"--ray reads its rows from -i DIR|FILE.parquet, not from {args.inputs[0]!r}")

        return run_cli(args)
    out_dir = Path(args.output_dir) if args.output_dir else None
    if out_dir is not None:
        check_output_dir(args.output_dir, "--output-dir")
    feeds, unnamed = _parse_inputs(list(args.inputs or []) + list(args.input or []))
    io = model_io(args.model) if Path(args.model).is_file() and not is_bundle_path(args.model) else None
    if io is not None:  # names known without compiling: check them now
        unknown = sorted(set(feeds) - set(io[0]))
        if unknown:
            raise InputError(f"unknown input name(s) {unknown}; the model's inputs are {io[0]}")
        _assign_unnamed(feeds, unnamed, io[0])
        unnamed = []
        if out_dir is not None:
            _check_free(out_dir, safe_file_names(io[1], taken=[OUTPUTS_JSON]), args.force)
    compiled = compile_or_load(args, host_fallback=args.host_fallback)
    _assign_unnamed(feeds, unnamed, compiled.input_names)  # a bundle: its names are known now
    files = safe_file_names(compiled.output_names, taken=[OUTPUTS_JSON])
    if out_dir is not None:
        _check_free(out_dir, files, args.force)
    if args.repeat < 1:
        raise InputError(f"--repeat must be at least 1, got {args.repeat}")
    outputs = compiled.run(feeds)
    if args.repeat > 1:
        with phase("warm runs", total=args.repeat - 1) as task:
            for _ in range(args.repeat - 1):
                outputs = compiled.run(feeds)
                task.advance()
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    for name, arr in outputs.items():
        stats = f"min {arr.min():.6g} max {arr.max():.6g} mean {arr.mean():.6g}" if arr.size and arr.dtype.kind in "fiu" else ""
        print(f"{name}: {arr.dtype} {list(arr.shape)} {stats}")
        if out_dir is not None:
            target = out_dir / files[name]
            try:
                np.save(target, arr, allow_pickle=False)
            except OSError as exc:
                raise InputError(f"cannot write output {name!r} to {target}: {exc.strerror or exc}") from None
            print(f"  -> {target}")
    if out_dir is not None:
        mapping = out_dir / OUTPUTS_JSON
        mapping.write_text(json.dumps(files, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"output name -> file: {mapping}")
    return 0


#: written next to the outputs of ``byoc run -o DIR``: output name -> file name
OUTPUTS_JSON = "outputs.json"


def _check_free(out_dir: Path, files: dict[str, str], force: bool) -> None:
    if force or not out_dir.exists():
        return
    clash = [f for f in [*files.values(), OUTPUTS_JSON] if (out_dir / f).exists()]
    if clash:
        raise InputError(f"--output-dir {out_dir}: {', '.join(clash[:5])}{' ...' if len(clash) > 5 else ''} "
                         f"already exist(s); pass --force to overwrite, or choose another folder")


def cmd_compile(args: argparse.Namespace) -> int:
    from byoc.cliutil import check_output_file, compile_or_load, is_bundle_path

    out = Path(args.output) if args.output else Path(args.model).with_suffix(".byoc")
    if is_bundle_path(args.model):
        raise InputError(f"{args.model} is already a bundle; compile an ONNX model")
    if args.host_only:
        if args.target:
            raise InputError("--host-only and --target exclude each other")
        args.target = []
    if out.exists() and Path(args.model).exists() and out.resolve() == Path(args.model).resolve():
        raise InputError(f"--output {out} is the model itself")
    check_output_file(str(out), "--output", force=args.force)
    compiled = compile_or_load(args)
    compiled.save(out)
    placed = collections.Counter(rec.device for rec in compiled.records.values())
    print(f"regions: {len(compiled.regions)}   nodes: " + ", ".join(f"{d} {n}" for d, n in sorted(placed.items())))
    for fault in compiled.faults:
        print(f"fallback: {fault}")
    calib = compiled.options.get("calibration")
    if calib:
        print(f"calibration: {calib['samples']} sample(s), {calib['tensors']} tensor(s)")
    print(f"bundle: {out} ({out.stat().st_size} bytes)")
    return 0


def _common_args(p: argparse.ArgumentParser, *, top: bool) -> None:
    default = None if top else argparse.SUPPRESS
    p.add_argument("--debug", action="store_true", default=False if top else argparse.SUPPRESS,
                   help="show the Python traceback of an error (also BYOC_DEBUG=1)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=default,
                   help="progress on stderr (default: only when stderr is a terminal)")


def build_parser() -> argparse.ArgumentParser:
    from byoc import __version__
    from byoc.cliutil import add_calibration_args

    parser = _Parser(prog="byoc", description="Bring Your Own Codegen: compile and run ONNX models.")
    parser.add_argument("--version", action="version", version=f"byoc {__version__}")
    _common_args(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("info", help="inputs, outputs, operator counts and unsupported operators of a model")
    p.add_argument("model")
    p.add_argument("--json", action="store_true", help="print JSON (byoc.info(model).to_json())")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("compile", help="compile a model and save it as one bundle file (MODEL.byoc)")
    p.add_argument("model")
    p.add_argument("--output", "-o", metavar="FILE.byoc", help="the bundle to write (default: MODEL with suffix .byoc)")
    p.add_argument("--target", "-t", action="append", metavar="TARGET",
                   help="target to use, in priority order (repeat); default: every installed target")
    p.add_argument("--host-only", action="store_true", help="use no target: everything runs on the host")
    p.add_argument("--force", action="store_true", help="overwrite an existing --output file")
    add_calibration_args(p)
    add_shape_argument(p)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="compile and run a model (or run a .byoc bundle) on .npy inputs")
    p.add_argument("model", help="an ONNX model, or a bundle written by `byoc compile`")
    p.add_argument("inputs", nargs="*", metavar="[NAME=]FILE.npy",
                   help="inputs: NAME=FILE.npy, or FILE.npy for the model's inputs in order")
    p.add_argument("--host-fallback", action="store_true",
                   help="bundle only: run regions whose plugin is missing or of another version on the host")
    p.add_argument("--input", "-i", action="append", metavar="[NAME=]FILE.npy",
                   help="an input, as the positional ones (repeat for each; with --ray: DIR or FILE.parquet)")
    p.add_argument("--output-dir", "-o", metavar="DIR",
                   help="write each output as DIR/<safe name>.npy, and DIR/outputs.json (output name -> file)")
    p.add_argument("--force", action="store_true", help="overwrite existing files in --output-dir")
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="run N times (the last outputs are kept)")
    p.add_argument("--target", "-t", action="append", metavar="TARGET",
                   help="target to use, in priority order (repeat); default: every installed target")
    add_calibration_args(p)
    # --ray: rows from --input DIR|FILE.parquet, outputs to -o OUT (Parquet, or .npy per row)
    p.add_argument("--ray", action="store_true", help="run on a Ray cluster: -i DIR|FILE.parquet -o OUT (see docs/ray.md)")
    p.add_argument("--address", metavar="ADDR", help="--ray: the cluster to join (default: start a local one)")
    p.add_argument("--concurrency", type=int, default=1, metavar="N", help="--ray: actors in the pool (default 1)")
    p.add_argument("--batch-size", type=int, default=16, metavar="N", help="--ray: rows per batch (default 16)")
    p.add_argument("--npy", action="store_true", help="--ray: write OUT/<row>/<output>.npy instead of Parquet")
    add_shape_argument(p)
    p.set_defaults(func=cmd_run)

    from byoc.report.commands import add_commands  # explain, partition, targets, doctor

    add_commands(sub)
    from byoc.testing.commands import add_commands as add_testing_commands  # conformance, new-plugin

    add_testing_commands(sub)
    from byoc.jitcache import add_command as add_warmup_command  # warmup

    add_warmup_command(sub)
    for child in sub.choices.values():
        _common_args(child, top=False)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    from byoc.cliutil import suggest

    argv = list(sys.argv[1:] if argv is None else argv)
    commands = parser._subparsers._group_actions[0].choices if parser._subparsers else {}
    top_options = [s for a in parser._actions for s in a.option_strings]
    for token in argv:  # an option before the command that only a command knows: say where it goes
        if not token.startswith("-"):
            break
        flag = token.split("=")[0]
        if flag == "--" or any(o.startswith(flag) for o in top_options):
            continue
        everywhere = sorted({s for child in commands.values() for a in child._actions for s in a.option_strings})
        if flag in everywhere:
            raise UsageError(parser.prog, f"option {flag!r} goes after the command: byoc COMMAND {flag} ...")
        raise UsageError(parser.prog, f"unknown option {flag!r}{suggest(flag, everywhere)}")
    args, extras = parser.parse_known_args(argv)
    if extras and isinstance(getattr(args, "inputs", None), list) and not any(e.startswith("-") for e in extras):
        args.inputs += extras  # `byoc run MODEL -o DIR x.npy`: argparse stops a positional list at an option
        extras = []
    if extras:
        child = parser._subparsers._group_actions[0].choices.get(args.command) if parser._subparsers else None
        prog = child.prog if child is not None else parser.prog
        options = [s for a in (child or parser)._actions for s in a.option_strings]
        first = extras[0]
        if first.startswith("-"):
            raise UsageError(prog, f"unknown option {first.split('=')[0]!r}{suggest(first.split('=')[0], options)}")
        raise UsageError(prog, f"unexpected argument(s): {' '.join(extras)}")
    return args


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _describe(exc: BaseException) -> tuple[str, int]:
    """The line to print and the exit status for an error that reached :func:`main`."""
    if isinstance(exc, ByocError):
        return f"{type(exc).__name__}: {_one_line(str(exc))}", EXIT_ERROR
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        root = exc.name.split(".")[0]
        return f"this needs the Python package {root!r}, which is not installed: pip install {root}", EXIT_ERROR
    if isinstance(exc, MemoryError):
        return f"out of memory{': ' + _one_line(str(exc)) if str(exc) else ''}", EXIT_ERROR
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or _one_line(str(exc)) or type(exc).__name__}{where}", EXIT_ERROR
    return (f"internal error: {type(exc).__name__}: {_one_line(str(exc))} (a bug in byoc or a plugin; "
            f"--debug or BYOC_DEBUG=1 shows the traceback)"), EXIT_INTERNAL


def main(argv: list[str] | None = None) -> int:
    """Run the ``byoc`` command; returns the exit status (see the module docstring)."""
    debug = _env.get("BYOC_DEBUG").strip().lower() in ("1", "true", "yes", "on")
    try:
        parser = build_parser()
        args = _parse(parser, argv)
    except UsageError as exc:
        print(f"{exc.prog}: error: {_one_line(str(exc))} (see '{exc.prog} --help')", file=sys.stderr)
        return EXIT_ERROR
    debug = debug or bool(getattr(args, "debug", False))
    prog = f"byoc {args.command}"
    try:
        from byoc.terminal import show_progress

        with show_progress(getattr(args, "progress", None)):
            return args.func(args)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader of stdout went away (``byoc targets | head``): nothing more to say
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except Exception as exc:  # noqa: BLE001 - the one place every error becomes one line
        if debug:
            traceback.print_exc()
        line, status = _describe(exc)
        print(f"{prog}: error: {line}", file=sys.stderr)
        return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
