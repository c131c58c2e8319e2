"""byoc's conformance suite (byoc.testing.suite) against the cpu target.

One test per claimed operator and pattern plus the whole-graph suites; ``byoc conformance cpu``
runs the same checks from the command line.
"""

from byoc.testing.suite import *  # noqa: F401,F403

import byoc_cpu.plugin as plugin


class Requirements(Requirements):  # noqa: F405
    target = "cpu"
    # only this plugin, in-process: other installed plugins never take nodes away
    plugins = (("cpu", plugin),)
