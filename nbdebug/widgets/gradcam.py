"""Grad-CAM widget: the input image and a CAM blended in the browser, every method side by side.

Synced state is small (layer names, class names and scores, the opacity/colormap the user picks,
the methods, the faithfulness ranking and the sanity flags); the image and the CAMs of all target
classes and methods of one sample/layer arrive as uint8 buffers on demand (``@rpc("view")``), the
faithfulness curves as float32 (``@rpc("curves")``), so switching class or method or moving the
opacity slider never asks the kernel.

>>> w = GradCamWidget(result, session)      # doctest: +SKIP
>>> w.opacity                               # the slider's last value, synced back from the browser
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import traitlets

from ..inspectors.cam_verdict import gradcam_headline, rank_cams
from ..inspectors.events import fmt_p
from ..inspectors.faithfulness import FRACTIONS, LOWER_IS_BETTER, METRICS
from ..inspectors.gradcam import GradCamResult, class_label, overlay_headline
from ..inspectors.sanity import THRESHOLD
from ..sessions.protocols import CamClicks
from ._base import NBWidget, rpc
from ._snapshot import MAX_SNAPSHOT_BYTES, code_html, colorize, encode_png, img_tag, upscale

__all__ = ["GradCamWidget", "cam_to_u8"]


def cam_to_u8(cams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """K×H×W CAMs (≥ 0) scaled by their own maxima to uint8, and those maxima (float32 K)."""
    peak = cams.reshape(cams.shape[0], -1).max(axis=1).astype(np.float32)
    scale = np.where(peak > 0, 255.0 / np.where(peak > 0, peak, 1.0), 0.0).astype(np.float32)
    u8 = np.clip(np.rint(cams * scale[:, None, None]), 0, 255).astype(np.uint8)
    return u8, peak


class GradCamWidget(NBWidget):
    """Grad-CAM overlay with an opacity slider, colormap, class and layer choice.

    Traits synced back from the browser: ``opacity`` (0–1), ``colormap``, ``class_rank`` (index into
    the sample's target classes), ``layer`` and ``sample``.
    """

    _view_name_ = "gradcam"

    #: Every layer with a spatial output (dropdown); CAMs of other layers are computed on request.
    layers = traitlets.List(traitlets.Unicode()).tag(sync=True)
    #: Layer shown.
    layer = traitlets.Unicode("").tag(sync=True)
    #: Layer chosen automatically (shown as "auto" in the dropdown).
    auto_layer = traitlets.Unicode("").tag(sync=True)
    #: The method shown large (the first of ``methods`` at first; the small multiples switch it).
    method = traitlets.Unicode("gradcam").tag(sync=True)
    #: Every method computed, in order (one small multiple each when there are several).
    methods = traitlets.List(traitlets.Unicode()).tag(sync=True)
    #: ``--faithfulness``: ``{"ranking", "auc": {method: {metric: AUC}}, "target", "target_name"}`` ({} without).
    faithfulness = traitlets.Dict().tag(sync=True)
    #: ``--sanity``: per method ``{"method", "rho", "flagged", "cascade": [[layer, rho], ...]}`` ([] without).
    sanity = traitlets.List().tag(sync=True)
    #: The methods panel's order (``--faithfulness``): per method ``{"method", "rank", "tied", "failed",
    #: "score", "rho"}``, those passing the sanity check first, tied methods sharing a rank ([] without).
    ranks = traitlets.List().tag(sync=True)
    #: ρ at or above which a map is flagged as not depending on the class decision.
    sanity_threshold = traitlets.Float(THRESHOLD).tag(sync=True)
    #: Per sample, its target classes: ``{"index", "name", "score", "prob"}`` (names are plain text).
    classes = traitlets.List().tag(sync=True)
    batch = traitlets.Int(1).tag(sync=True)
    sample = traitlets.Int(0).tag(sync=True)
    #: Which of the sample's target classes is shown (0 = top-1 with ``targets="topk"``).
    class_rank = traitlets.Int(0).tag(sync=True)
    #: Heatmap opacity over the image; the slider changes it in the browser only, then syncs here.
    opacity = traitlets.Float(0.5).tag(sync=True)
    colormap = traitlets.Unicode("inferno").tag(sync=True)
    notes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    image_note = traitlets.Unicode("").tag(sync=True)

    def __init__(self, result: GradCamResult, session: CamClicks, *, sample: int = 0, colormap: str = "inferno", **kwargs: Any) -> None:
        b = int(result.classes.shape[0])
        classes = [
            [
                {"index": int(result.classes[i, k]), "name": result.class_names[i][k],
                 "score": float(result.scores[i, k]), "prob": float(result.probs[i, k])}
                for k in range(result.classes.shape[1])
            ]
            for i in range(b)
        ]
        faith: dict[str, Any] = {}
        report = result.faithfulness_report
        if report is not None:
            faith = {"ranking": list(report.ranking), "target": int(report.target), "target_name": str(report.target_name),
                     "auc": {m: {k: _num(v) for k, v in a.items()} for m, a in report.auc.items()},
                     "lower_is_better": list(LOWER_IS_BETTER), "images": int(report.images), "forwards": int(report.forwards)}
        sanity = [{"method": m, "rho": _num(r), "flagged": bool(r == r and r >= THRESHOLD),
                   "cascade": [[str(name), _num(v)] for name, v in result.sanity_cascade.get(m, [])]}
                  for m, r in result.sanity.items()]
        rho = {m: _num(r) for m, r in result.sanity.items()}
        ranks = [r.as_json() for r in rank_cams(report.auc, rho)] if report is not None else []
        top = classes[0][0] if classes and classes[0] else {"name": "?", "prob": float("nan")}
        first = result.maps.get(result.layer)
        headline = gradcam_headline(result.method, top["name"], top["prob"], result.layer,
                                    zero_grad=bool(getattr(first, "zero_grad", False)), sanity=rho,
                                    auc=report.auc if report is not None else None,
                                    target_name=str(report.target_name) if report is not None else "")
        if faith:
            faith["ranking"] = [r["method"] for r in ranks]  # the panel's order: sanity before rank
        super().__init__(
            headline=headline, ranks=ranks, layers=list(result.layers), layer=result.layer, auto_layer=result.layer if result.auto_layer else "",
            method=result.method, methods=list(result.methods or [result.method]), classes=classes, batch=b,
            sample=min(max(sample, 0), b - 1), colormap=colormap, notes=list(result.notes), image_note=result.image_note,
            faithfulness=faith, sanity=sanity, **kwargs,
        )
        self._result = result
        self._session = session
        self._set_overlay_headline()
        self.observe(self._set_overlay_headline, names=["sample", "class_rank", "layer", "method"])

    @rpc("view")
    def _view(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Image and every target class's CAM of one sample and layer (uint8, one buffer each).

        ``layer`` is a call name (``act``, ``act#2``); a layer not computed yet is computed on demand
        (a deleted model answers with the ModelGoneError message as the error)."""
        sample = int(params.get("sample", self.sample))
        layer = str(params.get("layer") or self.layer)
        if not 0 <= sample < self.batch:
            raise IndexError(f"sample {sample} out of range (batch of {self.batch})")
        maps = self._result.maps.get(layer) or self._session.maps_for(layer)
        methods = maps.methods or [self.method]
        method = str(params.get("method") or self.method)
        method = method if method in methods else methods[0]
        u8, peak = cam_to_u8(maps.of(method if maps.methods else None)[0][sample])
        arrays: dict[str, Any] = {"cams": u8, "peak": peak}
        if len(methods) > 1:  # every method's CAMs: the small multiples, switched in the browser
            both = [cam_to_u8(maps.of(m)[0][sample]) for m in methods]
            arrays["all_cams"] = np.stack([c for c, _ in both])
            arrays["all_peak"] = np.stack([p for _, p in both])
        if self._result.image is not None:
            arrays["image"] = self._result.image[sample]
        if layer == self.layer:
            self._set_overlay_headline()
        info = {"layer": maps.layer, "sample": sample, "zero_grad": maps.zero_grad, "note": maps.note,
                "grid": maps.grid.describe(), "low_hw": list(maps.low.shape[-2:]), "method": method, "methods": methods}
        return info, arrays

    @rpc("curves")
    def _curves(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The faithfulness curves: ``curves`` M×4×S float32 (the target's probability; NaN past a
        metric's points), ``fractions`` 4×S, in ``methods`` × ``metrics`` order."""
        report = self._result.faithfulness_report
        if report is None:
            raise ValueError("no faithfulness curves: run the view with --faithfulness")
        methods = list(report.curves)
        width = max(len(FRACTIONS[m]) for m in METRICS)
        curves = np.full((len(methods), len(METRICS), width), np.nan, dtype=np.float32)
        fractions = np.full((len(METRICS), width), np.nan, dtype=np.float32)
        for j, metric in enumerate(METRICS):
            fractions[j, : len(report.fractions[metric])] = report.fractions[metric]
            for i, m in enumerate(methods):
                curves[i, j, : len(report.curves[m][metric])] = report.curves[m][metric]
        return {"methods": methods, "metrics": list(METRICS)}, {"curves": curves, "fractions": fractions}

    def fallback_html(self) -> str:
        """Static snapshot: the shown class's CAM over the (de-normalised) image, as one PNG."""
        info, arrays = self._view({"sample": self.sample, "layer": self.layer})
        classes = self.classes[self.sample] if self.classes else []
        k = min(max(self.class_rank, 0), max(len(classes) - 1, 0))
        cam = np.asarray(arrays["cams"][k])
        heat = colorize(cam, self.colormap).astype(np.float32)
        a = min(1.0, max(0.0, float(self.opacity)))
        image = arrays.get("image")
        base = np.asarray(image, dtype=np.float32) if image is not None and image.shape[:2] == cam.shape else np.zeros_like(heat)
        over = np.clip(np.rint((1 - a) * base + a * heat), 0, 255).astype(np.uint8)
        zoom = max(1, 224 // max(cam.shape))
        while zoom > 1 and len(encode_png(upscale(over, zoom))) * 4 // 3 > MAX_SNAPSHOT_BYTES - 8000:
            zoom -= 1
        pic = upscale(over, zoom)
        while len(encode_png(pic)) * 4 // 3 > MAX_SNAPSHOT_BYTES - 8000:
            pic = pic[::2, ::2]
        shown = classes[k] if classes else {"name": "?", "prob": float("nan")}
        rows = "".join(
            f"<li>{'<b>' if i == k else ''}{html.escape(class_label(c['name'], c['index']))} ({fmt_p(c['prob'])})"
            f"{'</b>' if i == k else ''}</li>"
            for i, c in enumerate(classes)
        )
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in [*self.notes, self.image_note, info.get("note") or ""] if n)
        return (
            "<div class='nbdebug-gradcam-static'>"
            + (f"<p class='nbd-headline'><b>{code_html(self.headline)}</b></p>" if self.headline else "")
            + f"<p>nbdebug {html.escape(info.get('method') or self.method)} on "
            f"<code>{html.escape(info['layer'])}</code> · sample {self.sample} · class {html.escape(shown['name'])} · "
            f"opacity {a:.2f} · {html.escape(self.colormap)}</p>"
            f"{img_tag(pic, 'Grad-CAM of ' + str(shown['name']))}<ol>{rows}</ol>"
            + self._checks_html() + (f"<ul>{notes}</ul>" if notes else "") + "</div>"
        )

    def _checks_html(self) -> str:
        """The faithfulness ranking and the sanity flags as small tables (static snapshot)."""
        out = ""
        faith = self.faithfulness
        if faith:
            head = "".join(f"<th>{html.escape(m)}{' ↓' if m in LOWER_IS_BETTER else ' ↑'}</th>" for m in METRICS)
            rows = "".join(
                f"<tr style='color:{'#595959' if r['failed'] else 'inherit'}'><td>{r['rank']}{'=' if r['tied'] else ''}</td>"
                f"<td>{html.escape(r['method'])}{' (fails sanity)' if r['failed'] else ''}</td>"
                + "".join(f"<td>{_fmt(faith['auc'][r['method']][k], 3)}</td>" for k in METRICS) + "</tr>" for r in self.ranks)
            out += (f"<p>faithfulness for {html.escape(faith['target_name'])} (AUC; methods that pass the sanity check "
                    f"first, then by insertion − deletion + ROAD; = a tie)</p><table><tr><th>#</th><th>method</th>{head}</tr>{rows}</table>")
        if self.sanity:
            rows = "".join(f"<tr><td>{html.escape(s['method'])}</td><td>{_fmt(s['rho'], 2)}</td><td>"
                           f"{'does not depend on the class decision' if s['flagged'] else ''}</td></tr>" for s in self.sanity)
            out += f"<p>sanity (Spearman ρ, layers after the CAM layer re-initialised)</p><table>{rows}</table>"
        return out

    def export_requests(self) -> list[tuple[str, dict[str, Any]]]:
        """Every sample × every layer whose CAMs are already computed (all classes come with each)."""
        layers = [n for n in self.layers if n in self._result.maps] or [self.layer]
        if self.layer not in layers:
            layers.insert(0, self.layer)
        # the params exactly as the view asks (js/src/gradcam.ts fetchView): the exported page looks
        # answers up by them; with several methods one answer holds them all
        return [("view", {"sample": s, "layer": n, "method": self.method}) for s in range(self.batch) for n in layers]

    def _set_overlay_headline(self, _change: Any = None) -> None:
        """``headline`` of the single-method view (:func:`~nbdebug.inspectors.gradcam.overlay_headline`):
        the shown sample, class and layer. With several methods the CAM panel's verdict is the headline
        (not set here). A layer not computed yet keeps the last sentence until its maps arrive."""
        if len(self.methods) > 1 or self.faithfulness or self.sanity:
            return  # the panel's verdict (faithfulness, sanity: inspectors/cam_verdict.py) stays the headline
        maps = self._result.maps.get(self.layer)
        classes = self.classes[self.sample] if self.classes else []
        if maps is None or not classes:
            return
        k = min(max(self.class_rank, 0), len(classes) - 1)
        c = classes[k]
        cam = maps.of(self.method if maps.methods and self.method in maps.methods else None)[0][self.sample, k]
        self.headline = overlay_headline(self.method, maps.layer, cam, name=c["name"], index=c["index"], prob=c["prob"],
                                         rank=k, zero_grad=maps.zero_grad, note=maps.note)

    def __repr__(self) -> str:
        more = f", methods={len(self.methods)}" if len(self.methods) > 1 else ""
        return f"GradCamWidget(layer={self.layer!r}, batch={self.batch}, classes={len(self.classes[0]) if self.classes else 0}{more})"


def _num(v: float) -> float | None:
    """A float for JSON (None for NaN: JSON has no NaN)."""
    v = float(v)
    return None if v != v else v


def _fmt(v: float | None, digits: int) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"
