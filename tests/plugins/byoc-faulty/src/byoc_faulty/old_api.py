"""A target built for a hook API byoc does not provide (``BYOC_FAULT=api-version``)."""

import byoc

from byoc_faulty import __version__, active

API_VERSION = 999


@byoc.hookimpl
def byoc_register_targets(register):
    if active("api-version"):
        register(byoc.Target("oldchip", version=__version__, device="npu", api_version=API_VERSION))


@byoc.hookimpl
def byoc_register_operators(register):
    register("Relu")  # never asked: the target is disabled
