"""``byoc conformance`` and ``byoc new-plugin``.

:func:`add_commands` adds them to the ``byoc`` command's sub-parsers (see :mod:`byoc.cli`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from byoc.contract.folders import atomic_write
from byoc.errors import ByocError, InputError, OptionError

TEMPLATE_DIR = Path(__file__).with_name("template")
_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,39}")


def cmd_conformance(args: argparse.Namespace) -> int:
    from byoc.cliutil import check_output_file, check_targets

    try:
        from byoc.testing.conformance import SUITES, Conformance
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "hypothesis":
            raise ByocError("byoc conformance needs hypothesis, which is not installed: pip install hypothesis") \
                from None
        raise
    from byoc.progress import phase
    from byoc.testing.requirements import Requirements

    check_output_file(args.json, "--json", allow_stdout=True, force=args.force)  # before any work
    check_targets([args.target])
    if args.examples is not None and args.examples < 1:
        raise OptionError("--examples must be at least 1")
    suites = None
    if args.suite:
        suites = [s.strip() for item in args.suite for s in item.split(",") if s.strip()]
        unknown = [s for s in suites if s not in SUITES]
        if unknown:
            raise OptionError(f"unknown suite(s) {unknown}; known: {', '.join(SUITES)}")
    req = Requirements()
    if args.operator:
        req.operators = [o.strip() for item in args.operator for o in item.split(",") if o.strip()]
    options = {}
    for pair in args.option or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise OptionError(f"--option expects KEY=VALUE (VALUE as JSON, else a string), got {pair!r}")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    req.target_options = options
    conf = Conformance(args.target, requirements=req, examples=args.examples, seed=args.seed)

    def progress(result) -> None:
        task.advance(detail=f"{result.suite} {result.name}")
        if not args.quiet:
            mark = {"pass": ".", "fail": "F", "rejected": "r", "untested": "u", "skipped": "s"}.get(result.status, "?")
            print(f"  {mark} {result.suite:<12} {result.name}  ({result.seconds:.1f} s)", file=sys.stderr, flush=True)

    with phase(f"conformance {args.target}") as task:
        report = conf.run(suites, progress)
    # with --json - the JSON owns stdout and the table goes to stderr
    print(report.format(verbose=args.verbose), file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        text = json.dumps(report.to_json(), indent=1, sort_keys=True) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            try:
                atomic_write(Path(args.json), text.encode("utf-8"))
            except OSError as exc:
                raise InputError(f"cannot write {args.json}: {exc.strerror or exc}") from None
            print(f"json: {args.json}", file=sys.stderr)
    return 0 if report.ok else 1


def render_template(name: str, dest: Path, *, force: bool = False) -> list[Path]:
    """Write the plugin template for target ``name`` into ``dest`` (``byoc-<name>/``); returns the files."""
    if not _NAME_RE.fullmatch(name):
        raise OptionError(f"plugin name {name!r}: use a lower-case identifier (letters, digits, '_'; "
                          "it becomes the target name and the module byoc_<name>)")
    module = f"byoc_{name}"
    dist = f"byoc-{name.replace('_', '-')}"
    values = {"{{name}}": name, "{{module}}": module, "{{dist}}": dist}
    if dest.exists() and any(dest.iterdir()) and not force:
        raise InputError(f"{dest} exists and is not empty; use --force to write into it")
    written = []
    for src in sorted(TEMPLATE_DIR.rglob("*.tmpl")):
        rel = src.relative_to(TEMPLATE_DIR).with_suffix("")
        rel = Path(*[module if part == "__module__" else part for part in rel.parts])
        text = src.read_text(encoding="utf-8")
        for key, value in values.items():
            text = text.replace(key, value)
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        written.append(out)
    if not written:  # pragma: no cover - a broken installation
        raise ByocError(f"the plugin template is missing from {TEMPLATE_DIR}")
    return written


def cmd_new_plugin(args: argparse.Namespace) -> int:
    dest = Path(args.dir) if args.dir else Path(f"byoc-{args.name.replace('_', '-')}")
    files = render_template(args.name, dest, force=args.force)
    print(f"wrote {len(files)} files to {dest}/:")
    for f in files:
        print(f"  {f.relative_to(dest)}")
    print(f"next: pip install -e {dest} && byoc conformance {args.name}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("conformance", help="check a target's plugin: operators, patterns, partitioning, bundles, faults",
                       description="Run byoc's conformance suites against an installed target and print a "
                                   "per-operator table (claimed, passed, rejected, failed with the smallest failing "
                                   "example, max error). Exit status 1 if any check fails.")
    p.add_argument("target", help="the target to check (see `byoc targets`)")
    p.add_argument("--json", metavar="FILE", help="also write the full report as JSON ('-': stdout)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    p.add_argument("--examples", "-n", type=int, default=None, metavar="N",
                   help="random instances per operator, pattern and suite (default 10)")
    p.add_argument("--seed", type=int, default=None, help="Hypothesis seed (default 0): runs are reproducible")
    p.add_argument("--suite", "-s", action="append", metavar="SUITE",
                   help="only these suites (repeat or comma-separate): registration, operators, patterns, partition, "
                        "bundle, determinism, faults, cost")
    p.add_argument("--operator", "-k", action="append", metavar="OP", help="only these operators (repeat or comma-separate)")
    p.add_argument("--option", "-O", action="append", metavar="KEY=VALUE", help="a target option (VALUE as JSON)")
    p.add_argument("--verbose", "-v", action="store_true", help="list every rejection reason, not only failures")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_conformance)

    p = sub.add_parser("new-plugin", help="write a new plugin package from the template (passes conformance as is)")
    p.add_argument("name", help="the target name (lower-case identifier); the package is byoc-NAME, module byoc_NAME")
    p.add_argument("--dir", "-d", metavar="DIR", help="where to write it (default: ./byoc-NAME)")
    p.add_argument("--force", action="store_true", help="write into a non-empty folder")
    p.set_defaults(func=cmd_new_plugin)


__all__ = ["TEMPLATE_DIR", "add_commands", "cmd_conformance", "cmd_new_plugin", "render_template"]
