"""The placement report: where every node runs and why.

``CompiledModel.report(format)`` and ``byoc explain`` render the same data
(:func:`report_data`, documented by ``schema.json``) as a terminal table (``"text"``), JSON
(``"json"``), Graphviz (``"dot"``) or one self-contained HTML page (``"html"``).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import TYPE_CHECKING, Any

from byoc.errors import OptionError
from byoc.report.data import SCHEMA_VERSION, report_data
from byoc.report.export import partitioned_onnx

if TYPE_CHECKING:  # pragma: no cover
    from byoc.runtime.protocols import CompiledView as CompiledModel

FORMATS = ("text", "json", "dot", "html")


def render(data: dict[str, Any], format: str = "text") -> str:  # noqa: A002 - the public keyword is "format"
    """Render report data (from :func:`report_data`) in one of :data:`FORMATS`."""
    if format == "text":
        from byoc.report.text import render_text

        return render_text(data)
    if format == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if format == "dot":
        from byoc.report.dot import render_dot

        return render_dot(data)
    if format == "html":
        from byoc.report.html import render_html

        return render_html(data)
    raise OptionError(f"unknown report format {format!r}; choose one of {', '.join(FORMATS)}")


def report(compiled: "CompiledModel", format: str = "text") -> str:  # noqa: A002
    """The placement report of ``compiled`` as a string in ``format``."""
    return render(report_data(compiled), format)


def schema() -> dict[str, Any]:
    """The JSON Schema of the report document (``byoc/report/schema.json``)."""
    return json.loads(resources.files("byoc.report").joinpath("schema.json").read_text(encoding="utf-8"))


__all__ = ["FORMATS", "SCHEMA_VERSION", "partitioned_onnx", "render", "report", "report_data", "schema"]
