"""The vendor contract: the one package a byoc plugin imports (hook API version 2).

Everything a plugin needs is here; the rest of the core may change without a vendor noticing.

* types: :class:`Target`, :class:`Region`, :class:`Artifact`, :class:`Pattern`, :class:`Rule`,
  :class:`SupportContext` (:mod:`byoc.contract.types`)
* typed options: :class:`Option` (:mod:`byoc.contract.options`)
* hooks: :data:`hookimpl`, :data:`HOOK_API_VERSION`, the specs in :mod:`byoc.contract.hookspecs`
* the pattern language: :func:`op`, :func:`const`, :func:`any_value`, :func:`alt`,
  :func:`tail`, :class:`Match`, :class:`PatternExpr` (:mod:`byoc.contract.patterns`)
* faults and the errors a plugin may raise: :class:`PluginFault`, :class:`OptionError`,
  :class:`PluginError`, :class:`InputError`, :class:`QuantizationError`, ...
* host execution: :class:`HostExecutor`, :class:`Fusion`, :class:`NodeSpec`
  (:mod:`byoc.contract.host`)
* shared helpers: :func:`attr`, :func:`input_at`, :func:`region_model_bytes`,
  :func:`host_callable` (:mod:`byoc.contract.helpers`)

Other public APIs a plugin may use: ``byoc`` (compile/load, for tests and tools),
``byoc.kernels`` (the reference kernels: ``make_kernel``, ``is_supported``, ``kernel``),
``byoc.quantize`` (the shared int8 quantiser) and, in tests only, ``byoc.testing``.
"""

from byoc.contract.types import (
    HOOK_API_VERSION,
    REGION_DOMAIN,
    REGION_OP,
    Artifact,
    Pattern,
    Region,
    Rule,
    SupportContext,
    Target,
)
from byoc.contract.options import Option, option_defaults, resolve_options
from byoc.contract.hookspecs import hookimpl, hookspec
from byoc.contract.patterns import Match, PatternExpr, alt, any_value, const, op, tail
from byoc.contract.faults import PluginFault
from byoc.contract.host import Fusion, HostExecutor, NodeSpec
from byoc.contract.helpers import attr, host_callable, input_at, region_model_bytes
from byoc.errors import (
    ByocError,
    InputError,
    KernelError,
    OptionError,
    PluginError,
    QuantizationError,
)

__all__ = [
    "HOOK_API_VERSION",
    "REGION_DOMAIN",
    "REGION_OP",
    "Artifact",
    "ByocError",
    "Fusion",
    "HostExecutor",
    "InputError",
    "KernelError",
    "Match",
    "NodeSpec",
    "Option",
    "OptionError",
    "Pattern",
    "PatternExpr",
    "PluginError",
    "PluginFault",
    "QuantizationError",
    "Region",
    "Rule",
    "SupportContext",
    "Target",
    "alt",
    "any_value",
    "attr",
    "const",
    "hookimpl",
    "hookspec",
    "host_callable",
    "input_at",
    "op",
    "option_defaults",
    "region_model_bytes",
    "resolve_options",
    "tail",
]
