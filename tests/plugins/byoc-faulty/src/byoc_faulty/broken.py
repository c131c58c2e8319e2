"""A plugin module that cannot be imported (``BYOC_FAULT=import``)."""

from byoc_faulty import active

if active("import"):
    raise ImportError("byoc_faulty.broken: simulated missing vendor library libfaulty.so")
