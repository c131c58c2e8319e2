"""Code generation: a region -> an :class:`byoc.Artifact` of kind ``cpu``/``python``.

lower (region body -> program) -> verify (the program stays inside its buffers) ->
emit (program -> Python source) -> pack the constants. Pure and deterministic: the same
region and options give byte-identical artifacts.
"""

from __future__ import annotations

from typing import Any, Mapping

from byoc.contract import Artifact, Region

from byoc_cpu.artifact import FORMAT, TARGET, build_metadata, pack_constants
from byoc_cpu.emit import emit
from byoc_cpu.lower import lower
from byoc_cpu.verify import verify


def generate(region: Region, options: Mapping[str, Any]) -> Artifact:
    program, consts = lower(region.model, dict(options))
    program["region"] = region.name
    verify(program)
    source = emit(program)
    data = pack_constants(consts)
    metadata = build_metadata(region.name, [v.name for v in region.model.graph.inputs],
                              [v.name for v in region.model.graph.outputs], program, source, data)
    return Artifact(TARGET, FORMAT, data, metadata)


__all__ = ["generate"]
