"""byoc's conformance suite (byoc.testing.suite) against the vitis target.

The DPU computes in int8: the kit generates random calibration samples for every instance and
compares with the float host reference within the target's declared tolerance, relative to each
output's range. ``byoc conformance vitis`` runs the same checks from the command line.
"""

from byoc.testing.suite import *  # noqa: F401,F403

import byoc_vitis.plugin as plugin


class Requirements(Requirements):  # noqa: F405
    target = "vitis"
    # only this plugin, in-process: other installed plugins never take nodes away
    plugins = (("vitis", plugin),)
