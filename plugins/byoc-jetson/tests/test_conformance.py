"""byoc's conformance suite (byoc.testing.suite) against the jetson target.

One test per claimed operator and pattern plus the whole-graph suites; on a machine without
TensorRT and a CUDA GPU the target runs its float16 CPU emulation. ``byoc conformance jetson``
runs the same checks from the command line.
"""

import os

from byoc.testing.suite import *  # noqa: F401,F403

import byoc_jetson.plugin as plugin


class Requirements(Requirements):  # noqa: F405
    target = "jetson"
    # only this plugin, in-process: other installed plugins never take nodes away
    plugins = (("jetson", plugin),)
    # float16 engines: beyond 65504 a value is infinite on the device too
    float_range = 65504.0
    # the CPU emulation, named: "auto" would pick TensorRT where it is installed (the GPU check
    # script runs the suite on TensorRT on purpose, with BYOC_JETSON_CONFORMANCE_RUNTIME=tensorrt)
    target_options = {"runtime": os.environ.get("BYOC_JETSON_CONFORMANCE_RUNTIME", "emulation")}
