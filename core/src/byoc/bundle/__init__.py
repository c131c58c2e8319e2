"""Bundles: one file holding a compiled model, written by ``CompiledModel.save``, read by ``byoc.load``.

A bundle is a zip archive of ONNX graphs, JSON and the vendors' opaque artifact bytes, with a
manifest of versions and the SHA-256 of every member (:mod:`byoc.bundle.format`). Nothing in a
bundle is ever unpickled or executed as code by byoc: graphs are ONNX protobuf, everything else
JSON or opaque bytes handed to the vendor's ``byoc_runtime`` hook. A bundle is untrusted input:
loading refuses, with a :class:`~byoc.BundleError` naming the member or plugin, anything it did
not write.

Modules, in the order data passes through them:

* :mod:`byoc.bundle.format` -- member names, limits, the checks writer and reader share
* :mod:`byoc.bundle.writer` -- ``save``: the members of a compiled model, written atomically
* :mod:`byoc.bundle.reader` -- read + verify: names, declared sizes, hashes, JSON, ONNX
* :mod:`byoc.bundle.loader` -- ``load`` (``byoc.load``): plugins, artifacts, the compiled model

This package imports the format, writer and reader; ``byoc.bundle.loader`` builds a
``CompiledModel`` (whose ``save`` uses the writer), so it is imported on its own.
"""

from byoc.bundle.format import FORMAT, FORMAT_VERSION, SUFFIX, BundleFallbackWarning, check_member_name, is_bundle
from byoc.bundle.writer import bundle_members, save

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "SUFFIX",
    "BundleFallbackWarning",
    "bundle_members",
    "check_member_name",
    "is_bundle",
    "save",
]
