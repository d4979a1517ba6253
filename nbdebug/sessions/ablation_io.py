"""The one request and the one answer of every ablation click: the attention view's heads, the
feature-map view's channels and the thermometer's rows (``js/src/lib/ablation.ts`` is the same shape
in TypeScript).

A request names what is switched off and how::

    {"kind": "heads",    "targets": [{"layer": 1, "units": [2]}, {"layer": 2, "units": [0]}], "mode": "zero"}
    {"kind": "channels", "targets": [{"layer": "layer4", "units": [3, 7]}],                  "mode": "mean"}
    {"kind": "modules",  "targets": [{"layer": "net.2", "units": []}],                       "mode": "zero"}

``layer`` is a block index (heads) or a module name; ``units`` are that layer's heads or channels, and
``[]`` (modules) the module's whole output. The answer says what was measured and by how much
(``metric``: its ``label``, ``kind``, ``clean``, ``ablated``, ``delta`` and ``of``, the token or class it
is about), the top classes or next tokens of both runs (``top``, or None), a note, the seconds, and what
one kind adds: the lens diff (heads), the Grad-CAM maps (channels: ``cam``, with the float32 arrays
``cam`` and ``cam_clean`` sent beside the JSON), the top-1 agreement (modules without a loss).

Every session that answers it satisfies :class:`~nbdebug.sessions.protocols.Ablates`.
"""

# no `from __future__ import annotations` here: the TypedDicts' NotRequired keys must be evaluated for
# `AblationAnswer.__optional_keys__` to know them (Python 3.11)
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, NotRequired, TypedDict

import numpy as np

from ..workbench.interventions import MODES
from .lens import LensEntry

__all__ = ["KINDS", "AblationAnswer", "AblationMetric", "AblationRequest", "AblationTarget", "Answered", "Ranked",
           "ablation_answer", "ablation_request", "ranked"]

AblationKind = Literal["heads", "channels", "modules"]
#: what the ``units`` of a target are, per request kind
KINDS: dict[str, str] = {"heads": "head", "channels": "channel", "modules": "module"}
_EMPTY = {"heads": "no head to ablate: click a head first",
          "channels": "no channel to ablate: click a channel tile first",
          "modules": "no module to ablate: select a row first"}


class AblationTarget(TypedDict):
    """One layer and its ablated units (``[]``: the whole output of the module)."""

    layer: str | int
    units: list[int]


class AblationRequest(TypedDict):
    kind: AblationKind
    targets: list[AblationTarget]
    mode: str


class Ranked(TypedDict):
    """One entry of a top-k list: a class or a next token (its display text) and its probability."""

    id: int
    label: str
    p: float


class Measured(TypedDict):
    """What the metric is about: a class or a token."""

    id: int
    label: str


class AblationMetric(TypedDict):
    """``kind``: "metric" (the view's metric, ``label`` says which), "p" (a probability), "loss" (the
    model's own loss) or "output" (mean |logits|, ``delta`` the mean |Δ logits|)."""

    label: str
    kind: Literal["metric", "p", "loss", "output"]
    clean: float
    ablated: float
    delta: float
    of: Measured | None


class Tops(TypedDict):
    clean: list[Ranked]
    ablated: list[Ranked]


class LensDiff(TypedDict):
    """The clean and ablated runs' lens columns (:class:`~nbdebug.sessions.lens.LensEntry` rows: ``embed``,
    the blocks, ``output``; ``p_answer`` is p(``metric.of``))."""

    clean: list[LensEntry]
    ablated: list[LensEntry]


class CamPair(TypedDict):
    """The Grad-CAM layer and the maps' shape (the maps are the arrays ``cam`` and ``cam_clean``)."""

    layer: str
    shape: list[int]


class AblationAnswer(TypedDict):
    kind: AblationKind
    targets: list[AblationTarget]
    mode: str
    metric: AblationMetric
    top: Tops | None
    note: str
    seconds: float
    lens: NotRequired[LensDiff]
    cam: NotRequired[CamPair]
    agreement: NotRequired[float]


#: an answer and the arrays sent beside it (``{}`` for most)
Answered = tuple[AblationAnswer, dict[str, np.ndarray]]


def ablation_request(params: Mapping[str, Any], kind: str) -> AblationRequest:
    """``params`` as a view sent them, checked for the view's ``kind`` (a clear ``ValueError`` else):
    targets of one layer merged, units sorted without repeats, heads' layers in block order; channels
    and modules one layer at a time."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: one of {', '.join(KINDS)}")
    if "targets" not in params:  # e.g. a panel still sending its old {heads} / {layer, channels} / {module}
        raise ValueError(f"an ablation request is {{kind, targets: [{{layer, units}}], mode}}; got the keys {sorted(params)}")
    got = params.get("kind", kind)
    if got != kind:
        raise ValueError(f"an ablation of {got!r} was sent to a view that ablates {kind}")
    mode = str(params.get("mode") or "zero")
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: one of {', '.join(MODES)}")
    merged: dict[str | int, set[int]] = {}
    for t in params.get("targets") or []:
        if not isinstance(t, Mapping) or "layer" not in t:
            raise ValueError(f"a target is {{layer, units}}, not {t!r}")
        layer = int(t["layer"]) if kind == "heads" else str(t["layer"])
        merged.setdefault(layer, set()).update(int(u) for u in t.get("units") or [])
    targets: list[AblationTarget] = [{"layer": k, "units": sorted(v)} for k, v in merged.items()]
    if kind == "heads":
        targets.sort(key=lambda t: int(t["layer"]))
    if kind == "modules" and any(t["units"] for t in targets):
        raise ValueError("a row ablates its module's whole output: send no units")
    if kind != "modules":
        targets = [t for t in targets if t["units"]]
    if not targets:
        raise ValueError(_EMPTY[kind])
    if kind != "heads" and len(targets) > 1:
        raise ValueError(f"one {KINDS[kind] if kind == 'modules' else 'layer'} at a time: got {len(targets)}")
    return {"kind": kind, "targets": targets, "mode": mode}  # type: ignore[typeddict-item]


def ablation_answer(request: AblationRequest, metric: AblationMetric, *, top: Tops | None = None, note: str = "",
                    t0: float, **extra: Any) -> AblationAnswer:
    """The answer to ``request`` (``t0``: ``time.perf_counter()`` when its work began); ``extra`` is the
    kind's own part (``lens``, ``cam``, ``agreement``)."""
    unknown = set(extra) - {"lens", "cam", "agreement"}
    if unknown:
        raise TypeError(f"not a part of an ablation answer: {sorted(unknown)}")
    return {"kind": request["kind"], "targets": request["targets"], "mode": request["mode"], "metric": metric,
            "top": top, "note": note, "seconds": time.perf_counter() - t0, **extra}  # type: ignore[typeddict-item]


def ranked(entries: list[dict[str, Any]], label: Callable[[dict[str, Any]], str]) -> list[Ranked]:
    """``{id, label, p}`` entries from a session's own list (``label``: the entry's display text)."""
    return [{"id": int(e["id"]), "label": label(e), "p": float(e["p"])} for e in entries]
