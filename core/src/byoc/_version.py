"""The version of byoc, in a module of its own so any part of the package can read it."""

__version__ = "2.0.0"  # major = the hook API version (byoc.contract.HOOK_API_VERSION)
