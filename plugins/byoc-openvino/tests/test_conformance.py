"""byoc's conformance suite (byoc.testing.suite) against the openvino target, in-process.

``byoc conformance openvino`` runs the same checks from the command line. The examples per
check stay small here (every instance is an OpenVINO compile); the README lists what the kit
found where OpenVINO disagrees with the reference and the rule or tolerance that records it.
"""

import os

from byoc.testing.suite import *  # noqa: F401,F403

import byoc_openvino.plugin as plugin


class Requirements(Requirements):  # noqa: F405
    target = "openvino"
    plugins = (("openvino", plugin),)
    examples = int(os.environ.get("BYOC_OPENVINO_EXAMPLES", "3"))
