"""The CAM family (issue 21): what the methods, faithfulness and the perturbation methods cost.

Run: ``python benchmarks/bench_cams.py [--rounds N] [--quick]``. One process, runs interleaved,
medians; a ResNet-18-shaped model (random init, eval mode, no torchvision), one 224×224 image,
target layer ``layer4`` (512 channels at 7×7), the top class:

- the six gradient/activation methods together (gradcam, gradcam++, hirescam, xgradcam, layercam,
  eigencam) against one Grad-CAM (target ≤ 1.1×): one forward and one backward serve them all;
- ablationcam and scorecam (512 perturbed forwards each, batched under ``max_bytes``) against the
  plain batched forwards of as many inputs (``model(x.expand(64, ...))`` × 8): "near the cost of
  their batched forwards";
- ``--faithfulness`` for the six methods: the perturbed images per method and the batched forwards
  they take, and its time in forward-equivalents (target ≤ 40 batched forwards per method).

``--quick``: a width-8 ResNet at 64², one round: checks the script runs to the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Figures, interleaved

from nbdebug.cams.checks import faithfulness
from nbdebug.recorders.gradcam import compute_cams, probe
from nbdebug.testing import ResNetShaped

SIX = "gradcam,gradcam++,hirescam,xgradcam,layercam,eigencam"
MAX_BYTES = 256 * 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="a width-8 ResNet at 64², one round")
    args = ap.parse_args()
    rounds = 1 if args.quick else args.rounds
    torch.manual_seed(0)
    model = (ResNetShaped(8, 10) if args.quick else ResNetShaped()).eval()
    hw = 64 if args.quick else 224
    x = torch.randn(1, 3, hw, hw)
    layer = next(lay for lay in probe(model, (x,), {})[0] if lay.name == "layer4")
    channels = int(layer.shape[1])  # NCHW
    chunk = 64 if not args.quick else 4
    print(f"CAM family on ResNet-18-shaped{' (width 8)' if args.quick else ''}, layer4 ({channels} channels), "
          f"{hw}×{hw}, torch {torch.__version__}, {torch.get_num_threads()} threads, median of {rounds} interleaved rounds")

    def cams(methods: str) -> object:
        return compute_cams(model, (x,), {}, layer, topk=1, methods=methods, output_hw=(hw, hw), max_bytes=MAX_BYTES)

    def forward() -> object:
        with torch.no_grad():
            return model(x)

    def batched_forwards() -> object:  # as many inputs as a perturbation method runs, in chunks
        with torch.no_grad():
            xb = x.expand(chunk, -1, -1, -1).contiguous()
            return [model(xb) for _ in range(-(-channels // chunk))]

    maps, classes, _ = compute_cams(model, (x,), {}, layer, topk=1, methods=SIX, output_hw=(hw, hw))
    report = faithfulness(model, (x,), {}, maps, classes, max_bytes=MAX_BYTES)

    def faith() -> object:
        return faithfulness(model, (x,), {}, maps, classes, max_bytes=MAX_BYTES)

    fns = {
        "inference forward (no_grad)": forward,
        "Grad-CAM alone": lambda: cams("gradcam"),
        "six methods together": lambda: cams(SIX),
        "ablationcam": lambda: cams("ablationcam"),
        "scorecam": lambda: cams("scorecam"),
        f"{channels} plain forwards, batches of {chunk}": batched_forwards,
        "faithfulness, six methods": faith,
    }
    cpu: dict[str, float] = {}
    t = interleaved(fns, rounds=rounds, warmup=1, cpu=cpu)
    fwd = "inference forward (no_grad)"
    print(f"\n{'what':<42} {'wall ms':>9} {'× fwd':>7} {'cpu ms':>9} {'× fwd':>7}")
    for k in fns:
        print(f"{k:<42} {t[k] * 1e3:>9.1f} {t[k] / t[fwd]:>7.2f} {cpu[k] * 1e3:>9.1f} {cpu[k] / cpu[fwd]:>7.2f}")
    six = cpu["six methods together"] / cpu["Grad-CAM alone"]
    ref = cpu[f"{channels} plain forwards, batches of {chunk}"]
    per_method_images = (report.images - 2) / 6
    per_method_forwards = report.forwards / 6
    print(f"\nsix methods / one Grad-CAM (CPU): {six:.3f} (target ≤ 1.1)")
    print(f"ablationcam / its plain batched forwards: {cpu['ablationcam'] / ref:.2f}; scorecam: {cpu['scorecam'] / ref:.2f}")
    print(f"faithfulness: {report.images} perturbed images ({per_method_images:.0f} per method + clean and blurred) in "
          f"{report.forwards} batched forwards ({per_method_forwards:.1f} per method; target ≤ 40); "
          f"{cpu['faithfulness, six methods'] / cpu[fwd]:.1f} forward-equivalents in all")
    fig = Figures("the issue-21 note and docs/comparison.md (CAM family)")
    fig.add("six gradient/activation methods / one Grad-CAM, ResNet-18 layer4 224²", f"{six:.2f}×")
    fig.add("ablationcam / plain batched forwards", f"{cpu['ablationcam'] / ref:.2f}×")
    fig.add("scorecam / plain batched forwards", f"{cpu['scorecam'] / ref:.2f}×")
    fig.add("faithfulness batched forwards per method", f"{per_method_forwards:.1f}")
    fig.print()


if __name__ == "__main__":
    main()
