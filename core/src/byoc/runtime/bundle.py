"""Moved: bundles are the package :mod:`byoc.bundle` (``byoc.load`` is :func:`byoc.bundle.loader.load`).

This module keeps the old import path working for code written against it; new code imports
from :mod:`byoc.bundle`.
"""

from byoc.bundle.format import FORMAT, FORMAT_VERSION, SUFFIX, BundleFallbackWarning, check_member_name, is_bundle
from byoc.bundle.loader import load
from byoc.bundle.writer import bundle_members, save

__all__ = [
    "BundleFallbackWarning",
    "FORMAT",
    "FORMAT_VERSION",
    "SUFFIX",
    "bundle_members",
    "check_member_name",
    "is_bundle",
    "load",
    "save",
]
