"""ONNX -> IR (validation, resource budgets) and IR -> ONNX."""

from byoc.frontend.loader import CANONICAL_OPSET, load_model, to_proto

__all__ = ["CANONICAL_OPSET", "load_model", "to_proto"]
