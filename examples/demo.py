"""The main job: compile a real model for each installed target alone, then with the default
selection; run it, check it against onnxruntime within each target's declared tolerance, and
show where it ran.

    python examples/demo.py                # ResNet-50 from the onnx wheel, seeded random weights
    python examples/demo.py -m squeezenet  # any of the nine model-zoo architectures
    python examples/demo.py --model path/to/model.onnx
    python examples/demo.py -t cpu         # only these targets (and the default run over them)

A target that runs int8 code (``Target.needs_calibration``, e.g. vitis) gets seeded random
calibration samples. Each result is PASS or FAIL against that target's ``rtol``/``atol``
(``|got - want| <= atol + rtol * |want|``; int8 targets relative to the output's range, as the
conformance kit compares them). The exit status is 1 if any run FAILs, 2 on bad arguments.
Progress goes to stderr on a terminal (``--progress``/``--no-progress`` to choose).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Result:
    name: str
    placement: str = ""
    compile_s: float = 0.0
    first_run_s: float = 0.0
    warm_ms: float = 0.0
    max_error: float = float("nan")
    ratio: float = float("nan")
    verdict: str = "FAIL"
    notes: list[str] = field(default_factory=list)


def placement(compiled) -> str:
    by_device = compiled.report_data()["totals"]["by_device"]
    parts = []
    for device, t in by_device.items():
        if t["nodes"] or device == "host":
            regions = f"/{t['regions']}r" if device != "host" else ""
            parts.append(f"{device} {t['nodes']}{regions} ({100 * t['flops_share']:.0f}% FLOPs)")
    return ", ".join(parts)


def tolerance_of(compiled, targets) -> tuple[float, float, bool, list[str]]:
    """(rtol, atol, range-relative, targets that took nodes): the loosest over the targets used."""
    used = [t for t in targets if any(rec.device == t.name for rec in compiled.records.values())]
    if not used:  # all on the host: the host's own numerics
        import byoc

        host = byoc.Target("host")
        return host.rtol, host.atol, False, []
    return (max(t.rtol for t in used), max(t.atol for t in used), any(t.needs_calibration for t in used),
            [t.name for t in used])


def run_one(name: str, model, feeds, expected, names, targets, calibration, runs: int,
            shapes: dict[str, list[int]]) -> Result:
    import byoc
    from byoc.progress import phase
    from byoc.testing.tolerance import compare

    res = Result(name)
    needs = any(t.needs_calibration for t in targets) if targets is not None else True
    t0 = time.perf_counter()
    try:
        compiled = byoc.compile(model, targets=None if targets is None else [t.name for t in targets],
                                calibration=calibration if needs else None, input_shapes=shapes)
    except byoc.ByocError as exc:
        res.notes.append(f"compile failed: {type(exc).__name__}: {' '.join(str(exc).split())}")
        return res
    res.compile_s = time.perf_counter() - t0
    res.placement = placement(compiled)
    for fault in compiled.faults:
        res.notes.append(f"fallback: {fault}")
    for skipped, why in compiled.options.get("skipped_targets", {}).items():
        res.notes.append(f"skipped target {skipped}: {why}")
    try:
        t0 = time.perf_counter()
        out = compiled.run(feeds)
        res.first_run_s = time.perf_counter() - t0
        compiled.wait()  # a first tier may have answered: the warm runs are at full speed
        times = []
        with phase(f"{name}: {runs} warm runs", total=runs) as task:
            for _ in range(runs):
                t0 = time.perf_counter()
                out = compiled.run(feeds)
                times.append(time.perf_counter() - t0)
                task.advance()
        res.warm_ms = float(np.median(times)) * 1e3 if times else float("nan")
    except byoc.ByocError as exc:
        res.notes.append(f"run failed: {type(exc).__name__}: {' '.join(str(exc).split())}")
        return res
    used = compiled.targets if targets is None else targets
    rtol, atol, ranged, took = tolerance_of(compiled, used)
    cmp = compare(list(out.values()), expected, rtol=rtol, atol=atol, names=names, range_relative=ranged)
    res.max_error, res.ratio = cmp.max_error, cmp.max_ratio
    res.verdict = "PASS" if cmp.ok else "FAIL"
    took_none = [t.name for t in (targets or []) if not any(r.region.target == t.name for r in compiled.regions)]
    if cmp.ok and targets and len(took_none) == len(targets):
        res.verdict = "UNUSED"  # correct, but the target ran nothing: not a pass of the target
        res.notes.append(f"{', '.join(took_none)} took no node: everything ran on the host")
    scale = "x output range" if ranged else "x |reference|"
    res.notes.insert(0, f"tolerance: atol {atol:g} + rtol {rtol:g} {scale}"
                        f" ({'of ' + ', '.join(took) if took else 'host'})")
    if not cmp.ok:
        res.notes.append(cmp.message)
    return res


def main(argv: list[str] | None = None) -> int:
    import byoc
    from byoc.testing.zoo import ZOO, load_zoo, zoo_inputs

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--zoo", default="resnet50", choices=sorted(ZOO), help="model-zoo architecture")
    parser.add_argument("--model", help="an ONNX file instead (inputs: seeded random data of each input's type)")
    parser.add_argument("--shape", action="append", metavar="NAME=D1,D2,...",
                        help="an input's shape (x=1,3,640,640) or a symbolic dimension's size (batch=1); repeat "
                             "for each (a symbolic dimension not given is 1)")
    parser.add_argument("-t", "--target", action="append", help="only these targets (default: every installed one)")
    parser.add_argument("--runs", type=int, default=5, help="warm runs per target (median shown)")
    parser.add_argument("--calibration-samples", type=int, default=8, metavar="N",
                        help="seeded random calibration samples for int8 targets")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress on stderr (default: only on a terminal)")
    args = parser.parse_args(argv)
    if args.runs < 0 or args.calibration_samples < 1:
        parser.error("--runs must be >= 0 and --calibration-samples >= 1")

    import onnx

    try:
        from byoc.testing.oracle import run_onnxruntime
    except ImportError:  # pragma: no cover
        run_onnxruntime = None
    from byoc.progress import phase
    from byoc.terminal import show_progress

    installed = byoc.list_targets()
    if args.target:
        known = {t.name: t for t in installed}
        unknown = [n for n in args.target if n not in known]
        if unknown:
            print(f"demo: unknown target(s) {unknown}; installed: {', '.join(known) or 'none'}", file=sys.stderr)
            return 2
        installed = [known[n] for n in args.target]
    try:
        model = onnx.load(args.model) if args.model else load_zoo(args.zoo)
    except Exception as exc:  # noqa: BLE001 - any unreadable file: one line
        print(f"demo: cannot read the model: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    from byoc.frontend.shapes import parse_shape_args

    try:
        shapes = parse_shape_args(args.shape) or {}
    except byoc.ByocError as exc:
        parser.error(str(exc))
    assumed: list[str] = []
    feeds = zoo_inputs(model, seed=1, shapes=shapes, assumed=assumed)
    label = args.model or f"{args.zoo} (onnx wheel, seeded random weights)"
    print(f"byoc {byoc.__version__}: {label}")
    print("inputs: " + ", ".join(f"{n} {a.dtype} {list(a.shape)}" for n, a in feeds.items())
          + (f" (taken as 1: {', '.join(assumed)}; --shape NAME=... sets them)" if assumed else ""))
    print("installed targets:", ", ".join(f"{t.name} {t.version} ({t.device}, {t.runtime_path or '-'}; "
                                          f"rtol {t.rtol:g}, atol {t.atol:g}"
                                          f"{', int8: needs calibration' if t.needs_calibration else ''}"
                                          f"{'' if t.is_available() else '; device absent: runs only when named'})"
                                          for t in installed) or "none (host only)")
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("demo: onnxruntime is not installed: nothing to check against (pip install onnxruntime)",
              file=sys.stderr)
        return 2

    results: list[Result] = []
    with show_progress(args.progress):
        with phase("onnxruntime reference"):
            expected = run_onnxruntime(model, feeds)
        names = [o.name for o in model.graph.output]
        calibration = [zoo_inputs(model, seed=100 + i, shapes=shapes) for i in range(args.calibration_samples)]
        runs = [(t.name, [t]) for t in installed]
        # the default, targets=None, takes only targets whose device is present (no emulations)
        present = [t.name for t in installed if t.is_available()]
        runs.append(("default (available: " + (", ".join(present) or "host only") + ")" if not args.target
                     else "default (" + ", ".join(args.target) + ")",
                     None if not args.target else installed))
        for name, targets in runs:
            res = run_one(name, model, feeds, expected, names, targets, calibration, args.runs,
                          {n: list(a.shape) for n, a in feeds.items()})
            results.append(res)
            print(f"\n== {name}: {res.verdict}")
            print(f"  placement: {res.placement or '-'}")
            print(f"  compile {res.compile_s:.2f} s, first run {res.first_run_s:.2f} s, warm median "
                  f"{res.warm_ms:.1f} ms; max abs. error vs onnxruntime {res.max_error:.3g} "
                  f"({res.ratio:.2f} of the tolerance)")
            for note in res.notes:
                print(f"  {note}")
            sys.stdout.flush()

    print("\nsummary:")
    width = max(len(r.name) for r in results)
    for r in results:
        print(f"  {r.name:<{width}}  {r.verdict}  error/tolerance {r.ratio:7.3f}  compile {r.compile_s:6.2f} s  "
              f"first run {r.first_run_s:6.2f} s  warm {r.warm_ms:8.1f} ms  {r.placement}")
    failed = [r.name for r in results if r.verdict == "FAIL"]
    unused = [r.name for r in results if r.verdict == "UNUSED"]
    passed = len(results) - len(failed) - len(unused)
    print(f"\n{passed} of {len(results)} passed" + (f"; ran nothing: {', '.join(unused)}" if unused else "")
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
