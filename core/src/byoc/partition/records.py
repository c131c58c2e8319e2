"""Per-node placement records: where each node runs and why.

The partitioner writes them, the compiled model keeps them, bundles store them and the report
renders them; this module depends on nothing else of byoc so all of those can import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NodeRecord:
    """Where one node ended up and why; the rows of the placement report."""

    name: str
    op_type: str
    device: str = "host"
    region: str | None = None
    pattern: str | None = None
    #: target -> ``None`` (supported) or the reason it was rejected
    verdicts: dict[str, str | None] = field(default_factory=dict)
    #: ``"<target>:<rule>"`` of the rule that dropped the node's region, if any
    rule: str | None = None
    #: why the node's region fell back to the host after being placed (plugin fault)
    fallback: str | None = None
    #: where the node lives: ``""`` for the main graph, else the path of its subgraph
    #: (``"<control-flow node>/<attribute>"``, nested with ``/``)
    scope: str = ""


__all__ = ["NodeRecord"]
