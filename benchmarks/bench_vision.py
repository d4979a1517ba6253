"""Vision views: Grad-CAM cost vs an inference forward pass and vs captum; feature-grid payload.

Run: ``python benchmarks/bench_vision.py [--reps N] [--quick]``. Prints tables; every ratio is measured in
this one process with the runs interleaved (the machine may be shared, so medians of N rounds), then
the figures README.md / docs/comparison.md quote, labelled. ``--quick``: a width-8 ResNet at 64² for
Grad-CAM, a 2×2 grid of a 64×16×16 map, one round: checks the script runs to the end.

Grad-CAM: a ResNet-18-shaped model (defined here, random init, no torchvision), eval mode,
224×224, target layer ``layer4``; nbdebug's cost is one forward (graph only after the layer) and
one batched backward through the head; captum's LayerGradCam builds the full graph (parameters
require grad) and needs one call per class. pytorch-grad-cam is not measured: ``pip install
grad-cam`` would pull torchvision, opencv and a different torch (checked with ``--dry-run``).

Peak memory: the rise of the process's peak RSS (VmHWM, reset through /proc/self/clear_refs)
during one call, with glibc's mmap threshold fixed so freed tensors leave the RSS (the script
re-executes itself with ``MALLOC_MMAP_THRESHOLD_=65536``).

Feature grid: ResNet-18 layer1 output (64×56×56, one sample): nbdebug's kernel-side preparation
(channel stats + per-channel uint8 + message packing) and payload vs a matplotlib 8×8 subplot grid
saved as PNG.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import statistics
import sys
import time
from collections.abc import Callable

if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None and sys.platform.startswith("linux"):
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    os.execv(sys.executable, [sys.executable, *sys.argv])

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from common import Figures, interleaved

from nbdebug.inspectors.featuremaps import encode_page
from nbdebug.recorders.gradcam import compute_cams, probe
from nbdebug.testing import ResNetShaped
from nbdebug.widgets._transport import pack_arrays


def ResNet18Shaped(classes: int = 1000) -> nn.Module:
    return ResNetShaped(64, classes)


def _status() -> dict[str, int]:
    text = open("/proc/self/status").read()
    return {k: int(re.search(k + r":\s+(\d+)", text).group(1)) * 1024 for k in ("VmRSS", "VmHWM")}  # type: ignore[union-attr]


def peak_mb(fn: Callable[[], object]) -> float:
    """Rise of the peak RSS during ``fn()`` in MB (Linux only; NaN elsewhere)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return float("nan")
    base = _status()["VmRSS"]
    fn()
    return (_status()["VmHWM"] - base) / 2**20


def bench_gradcam(reps: int, fig: Figures, quick: bool = False) -> None:
    from captum.attr import LayerAttribution, LayerGradCam

    torch.manual_seed(0)
    model = (ResNetShaped(8, 10) if quick else ResNet18Shaped()).eval()
    hw = 64 if quick else 224  # layer4 is 2×2 at 64²
    print(f"\nGrad-CAM on ResNet-18-shaped{' (width 8)' if quick else ''} (random init), layer4, {hw}×{hw}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {reps} interleaved rounds")
    header = f"{'batch':>5} {'method':<38} {'wall ms':>9} {'× fwd':>6} {'cpu ms':>9} {'× fwd':>6} {'peak MB':>8} {'× fwd':>6}"
    print(header)
    print("-" * len(header))
    out: dict[tuple[int, str], tuple[float, float]] = {}  # (batch, method) → (× forward wall, × forward peak)
    for batch in (1, 2) if quick else (1, 8):
        x = torch.randn(batch, 3, hw, hw)
        layer4 = next(lay for lay in probe(model, (x,), {})[0] if lay.name == "layer4")
        lgc = LayerGradCam(model, model.layer4)
        with torch.no_grad():
            top5 = model(x).topk(5, dim=1).indices

        def forward(x: torch.Tensor = x) -> object:
            with torch.no_grad():
                return model(x)

        def captum(k: int, x: torch.Tensor = x, top5: torch.Tensor = top5, lgc: LayerGradCam = lgc) -> Callable[[], object]:
            def run() -> object:
                maps = []
                for i in range(k):
                    a = lgc.attribute(x, target=top5[:, i].tolist(), relu_attributions=True)
                    maps.append(LayerAttribution.interpolate(a, (224, 224), "bilinear"))
                return maps
            return run

        fns: dict[str, Callable[[], object]] = {
            "inference forward (no_grad)": forward,
            "nbdebug Grad-CAM, 1 class": lambda x=x, layer4=layer4: compute_cams(model, (x,), {}, layer4, topk=1, output_hw=(224, 224)),
            "nbdebug Grad-CAM, top-5 at once": lambda x=x, layer4=layer4: compute_cams(model, (x,), {}, layer4, topk=5, output_hw=(224, 224)),
            "captum LayerGradCam, 1 class": captum(1),
            "captum LayerGradCam, top-5 (5 calls)": captum(5),
        }
        cpu: dict[str, float] = {}
        t = interleaved(fns, rounds=1 if quick else reps if batch == 1 else max(3, reps // 3), warmup=1, cpu=cpu)
        mem = {k: statistics.median(peak_mb(fn) for _ in range(1 if quick else 3)) for k, fn in fns.items()}
        model.zero_grad(set_to_none=True)  # captum leaves nothing, but be sure
        fwd = "inference forward (no_grad)"
        per_fwd = {k: v / mem[fwd] if mem[fwd] > 0 else float("nan") for k, v in mem.items()}  # tiny models: 0 MB
        for name in fns:
            print(f"{batch:>5} {name:<38} {t[name] * 1e3:>9.1f} {t[name] / t[fwd]:>6.2f} {cpu[name] * 1e3:>9.1f} "
                  f"{cpu[name] / cpu[fwd]:>6.2f} {mem[name]:>8.1f} {per_fwd[name]:>6.2f}")
            out[batch, name] = (t[name] / t[fwd], per_fwd[name])
    b1, b8 = sorted({b for b, _ in out})
    where = f"ResNet-18-shaped{' (width 8)' if quick else ''}, b{b1} / b{b8}"

    def both(name: str, i: int = 0) -> str:
        return f"{out[b1, name][i]:.2f}× / {out[b8, name][i]:.2f}×"

    fig.add(f"Grad-CAM, {where}, one class: nbdebug × an inference forward", both("nbdebug Grad-CAM, 1 class"))
    fig.add(f"Grad-CAM, {where}, one class: nbdebug's peak memory × the forward's", both("nbdebug Grad-CAM, 1 class", 1))
    fig.add(f"Grad-CAM, {where}, one class: captum LayerGradCam × an inference forward", both("captum LayerGradCam, 1 class"))
    fig.add(f"Grad-CAM, {where}, one class: captum's peak memory × the forward's", both("captum LayerGradCam, 1 class", 1))
    fig.add(f"Grad-CAM, {where}, top-5 classes: nbdebug (one batched backward)", both("nbdebug Grad-CAM, top-5 at once"))
    fig.add(f"Grad-CAM, {where}, top-5 classes: captum, five calls", both("captum LayerGradCam, top-5 (5 calls)"))


def bench_featuregrid(reps: int, fig: Figures, quick: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    torch.manual_seed(0)
    model = ResNet18Shaped().eval()
    store: dict[str, torch.Tensor] = {}
    handle = model.layer1.register_forward_hook(lambda m, i, o: store.__setitem__("a", o.detach()))
    try:
        with torch.no_grad():
            model(torch.randn(1, 3, 64 if quick else 224, 64 if quick else 224))
    finally:
        handle.remove()
    maps = store["a"][0]  # 64×56×56 (64×16×16 with --quick)
    side = 2 if quick else 8  # the matplotlib grid: side × side subplots

    def nbdebug_prep() -> int:
        page = encode_page(maps)
        st, ch = page.stats, page.channels
        _, buffers = pack_arrays({}, {"pixels": page.pixels, "channels": ch, "lo": st.lo[ch], "hi": st.hi[ch],
                                      "mean": st.mean[ch], "sparsity": st.sparsity[ch], "dead": st.dead[ch].astype("uint8")})
        return sum(len(b) for b in buffers)

    def matplotlib_grid() -> int:
        grid, axes = plt.subplots(side, side, figsize=(side, side))
        for i, ax in enumerate(axes.flat):
            ax.imshow(maps[i].numpy(), cmap="viridis")
            ax.axis("off")
        buf = io.BytesIO()
        grid.savefig(buf, format="png")
        plt.close(grid)
        return buf.tell()

    def forward() -> object:
        with torch.no_grad():
            return model(torch.randn(1, 3, 224, 224))

    t = interleaved({"forward": forward, "nbdebug": nbdebug_prep, "matplotlib": matplotlib_grid},
                    rounds=1 if quick else max(3, reps // 2), warmup=0 if quick else 1)
    nb_bytes, mpl_bytes = nbdebug_prep(), matplotlib_grid()
    samples = []
    for _ in range(5 if quick else 200):
        s = time.perf_counter()
        nbdebug_prep()
        samples.append(time.perf_counter() - s)
    pixels = maps.numel()
    shape = "×".join(map(str, maps.shape))
    print(f"\nFeature grid of ResNet-18 layer1 ({shape}, 1 sample)")
    header = f"{'method':<42} {'ms':>8} {'bytes':>9} {'bytes/pixel':>12} {'× forward':>10}"
    print(header)
    print("-" * len(header))
    print(f"{'nbdebug stats + uint8 + packing (median)':<42} {statistics.median(samples) * 1e3:>8.2f} {nb_bytes:>9} {nb_bytes / pixels:>12.3f} {statistics.median(samples) / t['forward']:>10.3f}")
    print(f"{f'  (best of {len(samples)})':<42} {min(samples) * 1e3:>8.2f}")
    print(f"{f'matplotlib {side}×{side} subplots → PNG':<42} {t['matplotlib'] * 1e3:>8.1f} {mpl_bytes:>9} {mpl_bytes / pixels:>12.3f} {t['matplotlib'] / t['forward']:>10.2f}")
    print(f"{'(inference forward, batch 1)':<42} {t['forward'] * 1e3:>8.1f}")
    fig.add(f"feature-map grid, {shape}: nbdebug", f"{nb_bytes / 1024:.0f} KB of uint8 ({nb_bytes / pixels:.2f} B/pixel), "
                                                   f"~{statistics.median(samples) * 1e3:.1f} ms")
    fig.add(f"feature-map grid, {shape}: matplotlib {side}×{side} subplots", f"{mpl_bytes / 1024:.0f} KB PNG, {t['matplotlib']:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--only", choices=["gradcam", "featuregrid"], default=None)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one round: checks the script runs to the end")
    args = ap.parse_args()
    fig = Figures("docs/comparison.md (Grad-CAM and feature-grid rows)")
    if args.quick:
        args.reps = 1
    if args.only in (None, "featuregrid"):
        bench_featuregrid(args.reps, fig, args.quick)
    if args.only in (None, "gradcam"):
        bench_gradcam(args.reps, fig, args.quick)
    fig.print()


if __name__ == "__main__":
    main()
