"""Helpers the ``byoc`` command's sub-commands share (:mod:`byoc.cli`, :mod:`byoc.report.commands`,
:mod:`byoc.testing.commands`): checks done before any work (output paths, target names, inputs,
calibration files), and compiling or loading a model with the command-line options.
"""

from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path
from typing import Any, Sequence

from byoc.errors import InputError, OptionError


def suggest(word: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, else ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# -- output paths -----------------------------------------------------------------------------------


def check_output_file(dest: str | None, what: str, *, allow_stdout: bool = False, force: bool = False) -> None:
    """Fail now if ``dest`` cannot be written later: a folder, a missing or read-only parent folder,
    or (without ``force``) a file that exists."""
    if dest is None or (allow_stdout and dest == "-"):
        return
    if dest == "":
        raise InputError(f"{what}: empty file name")
    p = Path(dest)
    if p.is_dir():
        raise InputError(f"{what}: {p} is a folder, expected a file name")
    if p.exists() and not p.is_file():
        raise InputError(f"{what}: {p} exists and is not a regular file")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise InputError(f"{what}: folder {parent} does not exist")
    if not parent.is_dir():
        raise InputError(f"{what}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{what}: folder {parent} is not writable")
    if p.exists() and not force:
        raise InputError(f"{what}: {p} already exists; pass --force to overwrite it")
    if p.exists() and not os.access(p, os.W_OK):
        raise InputError(f"{what}: {p} is not writable")


def check_distinct(pairs: Sequence[tuple[str, str | None]]) -> None:
    """Two options must not name the same output file."""
    seen: dict[str, str] = {}
    for option, dest in pairs:
        if dest is None or dest == "-":
            continue
        key = os.path.normcase(os.path.abspath(dest))
        if key in seen:
            raise InputError(f"{option} and {seen[key]} both write {dest}")
        seen[key] = option


def check_output_dir(dest: str, what: str) -> None:
    """Fail now if folder ``dest`` cannot be created or written."""
    p = Path(dest)
    if p.exists():
        if not p.is_dir():
            raise InputError(f"{what}: {p} exists and is not a folder")
        if not os.access(p, os.W_OK | os.X_OK):
            raise InputError(f"{what}: folder {p} is not writable")
        return
    ancestor = p.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(f"{what}: cannot create folder {p}: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(f"{what}: cannot create folder {p}: {ancestor} is not writable")


#: names Windows reserves for devices, whatever the extension
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)), *(f"lpt{i}" for i in range(1, 10))}


def safe_file_names(names: Sequence[str], suffix: str = ".npy", taken: Sequence[str] = ()) -> dict[str, str]:
    """Tensor name -> a file name that is safe on every platform and unique (case-insensitively).

    Characters other than letters, digits, ``-``, ``_`` and ``.`` become ``_``; leading dots go;
    empty or reserved names become ``output``; clashes get ``-2``, ``-3``, ... ``taken`` are
    file names already used (e.g. ``outputs.json``).
    """
    used = {t.lower() for t in taken}
    out = {}
    for name in names:
        base = "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "_" for c in name)
        base = base.lstrip(".").rstrip(". ")[:100] or "output"
        if base.split(".")[0].lower() in _RESERVED:
            base = "_" + base
        candidate, n = base + suffix, 1
        while candidate.lower() in used:
            n += 1
            candidate = f"{base}-{n}{suffix}"
        used.add(candidate.lower())
        out[name] = candidate
    return out


# -- model facts read cheaply (no weights) --------------------------------------------------------


def model_io(path: str) -> tuple[list[str], list[str]] | None:
    """``(input names, output names)`` of an ONNX file without its weights; ``None`` if unreadable
    (the compile then reports why)."""
    import onnx

    try:
        proto = onnx.load_model(path, load_external_data=False)
    except Exception:  # noqa: BLE001 - the frontend gives the real error later
        return None
    inits = {t.name for t in proto.graph.initializer}
    return [i.name for i in proto.graph.input if i.name not in inits], [o.name for o in proto.graph.output]


def is_bundle_path(path: str) -> bool:
    from byoc.bundle import is_bundle

    return Path(path).is_file() and is_bundle(path)


def check_model_path(path: str) -> None:
    p = Path(path)
    if not p.exists():
        raise InputError(f"model: file not found: {p}")
    if p.is_dir():
        raise InputError(f"model: {p} is a folder, expected an ONNX file or a .byoc bundle")


# -- targets ----------------------------------------------------------------------------------------


def check_targets(names: Sequence[str] | None) -> list[Any] | None:
    """Check ``--target`` names before any work: unknown (with a suggestion and the list of
    available targets) or repeated names are errors. Returns the Target objects (``None``: default)."""
    if names is None:
        return None
    from byoc.plugins import get_registry

    registry = get_registry()
    seen: set[str] = set()
    out = []
    for name in names:
        if name in seen:
            raise OptionError(f"--target {name!r} given twice")
        seen.add(name)
        if name not in registry.targets and name not in registry.conflicts and name not in registry.incompatible:
            known = sorted(registry.targets)
            listing = ", ".join(known) if known else "none installed (pip install a plugin, e.g. byoc-cpu)"
            raise OptionError(f"unknown target {name!r}{suggest(name, known)}; available targets: {listing}")
        out.append(registry.target(name))  # a duplicate or incompatible target raises here, naming the plugins
    return out


# -- calibration ------------------------------------------------------------------------------------


def add_calibration_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibration", metavar="DIR|FILE.npz",
                   help="calibration samples for int8 targets (e.g. vitis): a folder with one .npz per sample "
                        "(input name -> array), or one .npz whose arrays have a leading sample axis")
    p.add_argument("--calibration-samples", type=int, metavar="N", help="use only the first N calibration samples")


def load_calibration_arg(args: argparse.Namespace, targets: list[Any] | None, inputs: Sequence[str] | None):
    """The samples ``--calibration`` names (``None`` without it); explicit int8 targets without it fail now."""
    path = getattr(args, "calibration", None)
    count = getattr(args, "calibration_samples", None)
    if path is None:
        if count is not None:
            raise OptionError("--calibration-samples needs --calibration DIR|FILE.npz")
        needing = [t.name for t in targets or [] if getattr(t, "needs_calibration", False)]
        if needing:
            raise OptionError(f"target(s) {', '.join(map(repr, needing))} run int8 code and need calibration data: "
                              f"add --calibration DIR|FILE.npz (a folder with one .npz per sample, input name -> "
                              f"array, or one .npz with a leading sample axis)")
        return None
    from byoc.quantize.samples import load_calibration

    return load_calibration(path, samples=count, input_names=inputs)


def compile_or_load(args: argparse.Namespace, *, strict: bool = False, host_fallback: bool = True) -> Any:
    """The model ``args.model`` compiled with ``args.target``/``args.calibration``, or the bundle loaded.

    Every check (model path, target names, calibration files) happens before any work.
    """
    import byoc
    from byoc.frontend.shapes import parse_shape_args
    from byoc.progress import phase

    check_model_path(args.model)
    targets = getattr(args, "target", None)
    if is_bundle_path(args.model):
        if targets is not None:
            raise InputError(f"{args.model} is a bundle: its targets were fixed when it was compiled; drop --target")
        if getattr(args, "placement", "priority") != "priority":
            raise InputError(f"{args.model} is a bundle: its placement was fixed when it was compiled; drop --placement")
        if getattr(args, "calibration", None) is not None:
            raise InputError(f"{args.model} is a bundle: it was calibrated when it was compiled; drop --calibration")
        if getattr(args, "shape", None):
            raise InputError(f"{args.model} is a bundle: its input shapes were fixed when it was compiled; drop --shape")
        with phase(f"load bundle {args.model}"):
            return byoc.load(args.model, fallback="host" if host_fallback else None)
    chosen = check_targets(targets)
    io = model_io(args.model) if getattr(args, "calibration", None) is not None else None
    calibration = load_calibration_arg(args, chosen, io[0] if io else None)
    compiled = byoc.compile(args.model, targets=targets, strict=strict, calibration=calibration,
                            placement=getattr(args, "placement", "priority"),
                            input_shapes=parse_shape_args(getattr(args, "shape", None)))
    note_skipped(compiled)
    return compiled


def note_skipped(compiled: Any) -> None:
    import sys

    for name, why in compiled.options.get("skipped_targets", {}).items():
        hint = " (--calibration DIR|FILE.npz)" if "calibration" in why else " (--target " + name + ")"
        print(f"note: target {name!r} skipped: {why}{hint}", file=sys.stderr)


__all__ = [
    "add_calibration_args",
    "check_distinct",
    "check_model_path",
    "check_output_dir",
    "check_output_file",
    "check_targets",
    "compile_or_load",
    "is_bundle_path",
    "load_calibration_arg",
    "model_io",
    "note_skipped",
    "safe_file_names",
    "suggest",
]
