"""A plugin written for hook API version 1 (``BYOC_FAULT=api1``): it imports a module API 2 removed."""

from byoc_faulty import active

if active("api1"):
    from byoc.partition.types import Target  # noqa: F401  (hook API 1; byoc.contract since API 2)
