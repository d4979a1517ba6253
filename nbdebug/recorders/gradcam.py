"""Recorder of the Grad-CAM view: remembers the cell's model call, then computes CAMs on it.

The cell runs untouched (a :class:`~nbdebug.capture.ModelCall` and a shape-only
:class:`~nbdebug.capture.probe.OutputProbe` watch it). Afterwards nbdebug runs the model once
more on the same input with gradients tracked from the target layer on (also when the cell ran
under ``torch.no_grad`` or ``torch.inference_mode``), on clones of the buffers and with
parameters frozen (:func:`~nbdebug.runs.gradients.layer_pass`), so a graph the user still
holds stays valid. The recorder, the session and the widget hold the model weakly.

The computation without a cell or a widget (:func:`grad_cam`, :func:`compute_cams`,
:func:`probe`) is in :mod:`nbdebug.cams.methods`, importable from here too; the click session
:class:`GradCamSession` in :mod:`nbdebug.sessions.gradcam`; ``--faithfulness`` and ``--sanity`` in
:mod:`nbdebug.cams.checks`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ..adapters.outputs import logits_of
from ..adapters.unhookable import refuse_unhookable
from ..adapters.vision import InputSize, SpatialLayer, find_image, image_for_display, parse_floats
from ..cams.checks import faithfulness, sanity
from ..cams.methods import (
    compute_cams,
    grad_cam,
    nonzero_fallback,
    probe,
    spatial_of,
)
from ..capture import ModelCall, format_bytes, parse_bytes, select_modules, split_call_name
from ..capture.probe import OutputProbe
from ..capture.select import unwrap_compiled
from ..capture.state import user_hook_count
from ..inspectors.cams import PERTURBATION, parse_methods
from ..inspectors.gradcam import GradCamResult, class_names_for, parse_target, pick_layer
from ..runs.gradients import autograd_inputs, weight_versions
from ..runs.progress import LabelledProgress
from ..sessions.gradcam import GradCamSession
from ..views import Recorder

__all__ = ["GradCamRecorder", "GradCamSession", "compute_cams", "grad_cam", "probe"]


def _names(value: Any, ns: dict[str, Any] | None) -> Any:
    """Class names: an object, a variable name in the notebook, or a comma-separated list."""
    if isinstance(value, str):
        if ns is not None and value in ns:
            return ns[value]
        if "," in value:
            return [v.strip() for v in value.split(",")]
        raise ValueError(f"--class-names: no variable named {value!r} in the notebook")
    return value


class GradCamRecorder(Recorder):
    """Options read: ``gradcam_layer``, ``target``, ``cam_topk``, ``cam_method`` (one method, a
    comma-separated list or ``all``), ``faithfulness``, ``sanity``, ``class_names``, ``image_mean``,
    ``image_std``, ``reshape``, ``sample``, ``colormap``, ``max_bytes``, ``user_ns``.

    Holds the model weakly (``self.model`` raises :class:`~nbdebug.capture.ModelGoneError` once it
    is gone). A cell that calls the model several times is explained on its first call.
    """

    def __init__(self, model: nn.Module, **options: Any) -> None:
        refuse_unhookable(model)  # TorchScript, torch.export: hooks cannot see its layers (one line instead)
        super().__init__(model, **options)
        o = options
        self.layer: str | None = o.get("gradcam_layer") or None
        if self.layer:
            # Unknown names fail before the cell runs (the magic turns this into a UsageError);
            # whether the layer has a spatial output is only known after the run.
            select_modules(model, split_call_name(self.layer)[0])
        self.target = parse_target(o.get("target"))
        self.topk = 5 if o.get("cam_topk") is None else int(o["cam_topk"])
        if self.topk < 1:
            raise ValueError(f"--topk {self.topk}: explain at least one class")
        self.methods = parse_methods(o.get("cam_method"))
        self.method = self.methods[0]
        self.faithfulness = bool(o.get("faithfulness"))
        self.sanity = bool(o.get("sanity"))
        self.class_names = _names(o.get("class_names"), o.get("user_ns"))
        self.mean = parse_floats(o.get("image_mean"))
        self.std = parse_floats(o.get("image_std"))
        self.reshape = o.get("reshape")
        self.sample = 0 if o.get("sample") is None else int(o["sample"])
        self.colormap = str(o.get("colormap") or "inferno")
        self.max_bytes = parse_bytes(o.get("max_bytes"))
        self._call: ModelCall | None = ModelCall(model)
        self._size = InputSize()
        self._weights: tuple[int, ...] | None = None  # the parameters' versions at the explained call
        self._probe = OutputProbe(model, on_first_call=self._first_call)
        self._seen = False
        self._interrupted = False
        self._calls = 0
        self._inputs: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})
        self._theirs: torch.Tensor | None = None  # the cell's class scores (detached)
        self._output_shape: list[int] | None = None
        self._layers: list[SpatialLayer] = []
        self._result: GradCamResult | None = None
        self.session: GradCamSession | None = None

    def _first_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The cell's first model call: the image size, and the weights' version counters (to tell
        later whether an optimizer step changed them before nbdebug's re-run)."""
        self._size(args, kwargs)
        self._weights = weight_versions(unwrap_compiled(self.model))

    def _item_bytes(self) -> int | None:
        """One perturbed forward's memory, estimated from the first call's outputs (per sample): three
        times the largest and the input (None without a record)."""
        sizes = [int(np.prod(r.shape[1:], dtype=np.int64)) * torch.empty((), dtype=r.dtype).element_size()
                 for r in self._probe.records if len(r.shape) >= 2]
        img = find_image(*self._inputs)
        first = int(img[:1].numel() * img.element_size()) if img is not None else 0
        return 3 * max(sizes) + first if sizes else None

    def __enter__(self) -> GradCamRecorder:
        assert self._call is not None, "a GradCamRecorder is entered once"
        self._call.__enter__()
        try:
            self._probe.__enter__()
        except BaseException:
            self._call.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        kind = exc[0] if exc else None
        self._interrupted = isinstance(kind, type) and issubclass(kind, KeyboardInterrupt)
        try:
            self._probe.__exit__(*exc)
        finally:
            call, self._call = self._call, None  # nothing of ours keeps the model (ModelCall holds it)
            if call is not None:
                call.__exit__(*exc)
                self._keep(call)

    def _keep(self, call: ModelCall) -> None:
        """What the view needs from the cell's call, without the model or the user's graph (nothing
        after Ctrl-C: the view then does not apply)."""
        self._seen, self._calls = call.seen, call.calls
        if not call.seen:
            return
        self._layers = spatial_of(self.model, self._probe, self._size.hw, self.reshape)  # from the probe: no pass
        if self._interrupted:
            return
        self._inputs = autograd_inputs(call.args or (), call.kwargs or {})
        scores = logits_of(call.output)
        self._output_shape = None if scores is None else list(scores.shape)
        self._theirs = scores.detach() if scores is not None and scores.dim() == 2 else None

    def applies(self) -> str | None:
        """None, or why there is nothing to explain: the cell was interrupted (Ctrl-C: no new passes
        then), the model never ran, no spatial layer, no class scores."""
        if not self._seen:
            return "the cell never called the model, so there is nothing to explain"
        no_spatial = "no layer has a spatial output (B×C×H×W, B×H×W×C or a token grid)"
        if self._probe.completed and not self._layers:  # what the model is, before what happened later in the cell
            return no_spatial
        if self._interrupted:
            return "the cell was interrupted; Grad-CAM would need a new forward and backward — re-run the cell to see it"
        if not self._probe.completed:
            return "the model raised during its first call, so there are no class scores to explain"
        if not self._layers:
            return no_spatial
        if self._theirs is None:
            return f"the model's output is not class scores (batch×classes); got shape {self._output_shape}"
        return None

    def result(self) -> GradCamResult:
        if self._result is None:
            self._result = self._compute()
        return self._result

    def _compute(self) -> GradCamResult:
        if not self._seen:
            raise RuntimeError("the cell never called the model, so there is nothing to explain; call it once, e.g. `model(x)`")
        progress = LabelledProgress()
        try:
            return self._explain(progress)
        finally:
            progress.close()

    def _explain(self, progress: LabelledProgress) -> GradCamResult:
        layers = self._layers
        chosen, auto = pick_layer(layers, self.layer, self._probe.describe_all())
        model = self.model
        session = GradCamSession(model, *self._inputs, layers, methods=self.methods, reshape=self.reshape, max_bytes=self.max_bytes,
                                 item_bytes=self._item_bytes(), order=[r.module for r in self._probe.records], progress=progress)
        self.session = session
        has_names = self.class_names is not None or getattr(getattr(model, "config", None), "id2label", None)
        name_of = class_names_for(model, self.class_names, 0) if has_names else str
        maps, logits = session.compute(chosen, targets=self.target, topk=self.topk, name_of=name_of, auto=auto)
        notes: list[str] = []
        found = nonzero_fallback(layers, chosen, maps, lambda cand: session.compute(cand, auto=True)[0]) if auto else None
        if found is not None:
            notes.append(f"{chosen.name} (the last layer with a spatial output) has a zero gradient; "
                         f"{found[0].name} is the last one the scores depend on")
            chosen, maps = found
        session.pin(chosen.name, maps)
        if session.dropped:
            notes.append(f"--max-bytes budget of {format_bytes(self.max_bytes)}: the CAMs of {len(session.dropped)} other layer(s) "
                         "were not kept (recomputed when you pick them); the shown layer's are")
        elif self.max_bytes < session.cam_bytes(maps):
            notes.append(f"--max-bytes budget of {format_bytes(self.max_bytes)}: only the shown layer's CAMs "
                         f"({format_bytes(session.cam_bytes(maps))}) are kept; other layers are recomputed when you pick them")
        if maps.note:
            notes.append(maps.note)
        notes.extend(maps.notes)
        classes = session.classes
        assert classes is not None
        checks = self._checks(session, chosen, maps, classes, name_of, progress, notes)
        session.progress = None  # layers fetched later from the widget: no bar
        notes.extend(self._rerun_notes(chosen.name, model, logits))
        probs = torch.softmax(logits.float(), dim=1).gather(1, classes).cpu().numpy()
        scores = logits.float().gather(1, classes).cpu().numpy()
        cls = classes.cpu().numpy().astype(np.int64)
        names = [[name_of(int(c)) for c in row] for row in cls]
        image, image_note = (None, "no image input found")
        if session.image is not None and session.image.dim() == 4:
            image, image_note = image_for_display(session.image, self.mean, self.std)
        return GradCamResult(
            layer=chosen.name, auto_layer=auto, method=maps.methods[0] if maps.methods else self.method, classes=cls,
            scores=scores, probs=probs, class_names=names, layers=[lay.name for lay in layers if lay.module], maps=session.maps,
            image=image, image_note=image_note, notes=notes, methods=maps.methods, **checks,
        )

    def _checks(self, session: GradCamSession, layer: SpatialLayer, maps: Any, classes: torch.Tensor, name_of: Any,
                progress: LabelledProgress, notes: list[str]) -> dict[str, Any]:
        """``--faithfulness`` and ``--sanity`` on the shown layer: the result's fields (a problem is a note)."""
        out: dict[str, Any] = {}
        model, (args, kwargs) = self.model, self._inputs
        if self.faithfulness and session.image is None:
            notes.append("faithfulness: no image among the model's inputs to perturb")
        elif self.faithfulness:
            report = faithfulness(model, args, kwargs, maps, classes, name_of=name_of, max_bytes=self.max_bytes,
                                  item_bytes=session.item_bytes, progress=progress)
            out["faithfulness"], out["faithfulness_report"] = report.auc, report
            shared = f" ({report.images - report.distinct} the same image as another method's: run once)" if report.distinct < report.images else ""
            notes.append(f"faithfulness: {report.images} perturbed images of sample 0 for {report.target_name}{shared} "
                         f"in {report.forwards} batched forwards")  # the order is the panel's (sanity before score)
        if self.sanity:
            calls = [(r.module, r.call) for r in self._probe.records]
            report_s = sanity(model, args, kwargs, layer, maps, classes, calls=calls, reshape=self.reshape, output_hw=session.output_hw,
                              max_bytes=self.max_bytes, item_bytes=session.item_bytes, progress=progress)
            out["sanity"], out["sanity_cascade"] = report_s.rho, report_s.cascade
            notes.extend(report_s.notes)
            for m in report_s.flagged:
                notes.append(f"sanity: {m}'s map does not depend on the class decision (Spearman {report_s.rho[m]:.2f} with "
                             f"the {len(report_s.layers)} layer(s) after {layer.name} re-initialised)")
        return out

    def _rerun_notes(self, layer: str, model: nn.Module, logits: torch.Tensor) -> list[str]:
        """What differs between nbdebug's re-run and the cell's call, in words."""
        notes: list[str] = []
        mode = self._probe.grad_mode
        mode = f" (your cell ran under torch.{mode})" if mode in ("no_grad", "inference_mode") else ""
        notes.append(f"nbdebug ran the model once more on your cell's input, tracking gradients from {layer} on{mode}; "
                     "parameters' .grad, buffers and training mode are left as they were")
        if any(m in PERTURBATION for m in self.methods) or self.faithfulness or self.sanity:
            notes[-1] += "; the perturbation forwards ran on copies of the input (and of the model, for --sanity)"
        hooks = user_hook_count(model)
        if hooks:
            notes.append(f"nbdebug's re-run did not call your {hooks} hook(s) on the model (your cell's call did, as usual)")
        if model.training:
            notes.append("the model is in training mode: dropout and batch statistics apply to that run as in your cell")
        if self._calls > 1:
            notes.append(f"the cell called the model {self._calls} times; the first call is explained")
        if self._theirs is not None and self._theirs.shape == logits.shape:
            theirs = self._theirs.float()
            diff = float((theirs - logits.float()).abs().max())
            if diff > 1e-3 * (1 + float(theirs.abs().max())):
                stepped = self._weights is not None and self._weights != weight_versions(unwrap_compiled(model))
                why = ("the weights changed after the call it explains: an optimizer step in the cell" if stepped
                       else "dropout or other randomness?")
                notes.append(f"the re-run's scores differ from your cell's by up to {diff:.3g} ({why})")
        return notes

    def widget(self) -> Any:
        from ..widgets.gradcam import GradCamWidget

        res = self.result()
        assert self.session is not None
        return GradCamWidget(res, self.session, sample=self.sample, colormap=self.colormap)
