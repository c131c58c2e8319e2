"""Claims the ``testchip`` target that byoc-testplugin already provides (``BYOC_FAULT=duplicate``)."""

import byoc

from byoc_faulty import __version__, active


@byoc.hookimpl
def byoc_register_targets(register):
    if active("duplicate"):
        register(byoc.Target("testchip", version=__version__, description="an impostor", device="npu"))
