"""ResNet-50 bundle: size against the weights, and byoc.load time in fresh processes (warm caches).

    python benchmarks/bundle_bench.py OUT_DIR
"""
import subprocess
import sys
import zipfile
from pathlib import Path

import onnx

import byoc
from byoc.testing.zoo import load_zoo

out = Path(sys.argv[1])
model = load_zoo("resnet50")
weights = sum(onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
cm = byoc.compile(model, wait=True, targets=["cpu"])
path = cm.save(out / "resnet50.byoc")
with zipfile.ZipFile(path) as zf:
    sizes = {i.filename: (i.file_size, i.compress_size) for i in zf.infolist()}
total = path.stat().st_size
print(f"weights {weights/1e6:.1f} MB, bundle {total/1e6:.1f} MB = {total/weights:.3f}x")
for n, (s, c) in sorted(sizes.items(), key=lambda kv: -kv[1][0])[:5]:
    print(f"  {n}: {s/1e6:.2f} MB ({c/1e6:.2f} MB compressed)")
code = f"""
import time; t0 = time.perf_counter()
import byoc
t1 = time.perf_counter()
cm = byoc.load({str(path)!r})
t2 = time.perf_counter()
print(round(t1 - t0, 3), round(t2 - t1, 3))
"""
subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)  # warm the caches
rows = []
for _ in range(3):
    r = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    rows.append([float(v) for v in r.stdout.split()])
imp = sorted(r[0] for r in rows)[1]
load = sorted(r[1] for r in rows)[1]
print(f"fresh process, warm cache: import byoc {imp:.2f} s, byoc.load {load:.2f} s (median of 3)")
