"""Export a Hugging Face transformer built from its config (seeded random weights, nothing
downloaded) to ONNX with today's ``torch.onnx.export`` (the dynamo exporter), for the benchmarks
that take a model file (``startup_bench.py --model``, ``bench_models.py --model``).

Needs torch (CPU build) and transformers, e.g. the ``torch`` tox environment:

    .tox/torch/bin/python benchmarks/export_transformer.py bert-base /tmp/bert-base.onnx
    .tox/torch/bin/python benchmarks/export_transformer.py bert-base /tmp/bert.onnx --layers 2 --seq 64

The model takes ``input_ids`` and ``attention_mask`` of shape ``batch x sequence`` (both
symbolic in the file) and returns ``last_hidden_state``.
"""

from __future__ import annotations

import argparse
import sys

#: name -> (transformers config class, its fields)
CONFIGS = {
    "bert-base": ("BertConfig", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                     intermediate_size=3072)),
    "bert-small": ("BertConfig", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                      intermediate_size=1024)),
    # a GPT-2-like decoder (causal attention), without its key/value cache
    "gpt2-small": ("GPT2Config", dict(n_embd=256, n_layer=4, n_head=4, n_positions=1024, use_cache=False)),
}


def _importable_torchvision() -> None:
    """transformers imports torchvision, whose C++ extension does not load with torch's CPU wheel:
    declare the two schemas its import registers kernels for (as tests/torch/torchfe.py does)."""
    import torch

    try:
        import torchvision  # noqa: F401
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
        for name in [k for k in sys.modules if k.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        global _SCHEMAS
        _SCHEMAS = torch.library.Library("torchvision", "DEF")
        _SCHEMAS.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _SCHEMAS.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(CONFIGS))
    parser.add_argument("output", help="the .onnx file to write (weights inside it)")
    parser.add_argument("--layers", type=int, help="number of encoder layers (default: the config's)")
    parser.add_argument("--seq", type=int, default=128, help="the sequence length traced (default 128)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch

    _importable_torchvision()
    import transformers

    kind, fields = CONFIGS[args.name]
    if args.layers:
        fields = {**fields, "num_hidden_layers": args.layers}
    config = getattr(transformers, kind)(**fields, attn_implementation="eager")
    torch.manual_seed(args.seed)
    model = transformers.AutoModel.from_config(config).eval()

    class Encoder(torch.nn.Module):  # one output tensor, plain arguments
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

    ids = torch.randint(0, config.vocab_size, (1, args.seq))
    mask = torch.ones(1, args.seq, dtype=torch.int64)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=config.max_position_embeddings)
    with torch.no_grad():
        torch.onnx.export(Encoder(), (ids, mask), args.output, input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"], dynamo=True, external_data=False,
                          dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}})
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
