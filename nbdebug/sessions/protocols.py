"""What a widget may ask of its click session: one :class:`typing.Protocol` per kind of session, so a
widget types its session by what it calls (never ``Any``) and a test double needs no model.

Each session in this package satisfies one of them (checked in ``tests/unit/test_architecture.py``):
:class:`~nbdebug.sessions.ablation.AblationSession` (heads), :class:`~nbdebug.sessions.channels.ChannelAblation`
(channels) and :class:`~nbdebug.sessions.thermometer.ModuleAblation` (rows): one :class:`Ablates`;
:class:`~nbdebug.sessions.patching.PatchSession`, :class:`~nbdebug.sessions.steer.SteerLens`,
:class:`~nbdebug.sessions.gradcam.GradCamSession`, :class:`~nbdebug.sessions.attribution.AttributionSession`. Every answer is plain JSON-able data except the
lens (a :class:`~nbdebug.inspectors.logitlens.LogitLens`) and the CAM maps.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..attribution import Attribution
from ..inspectors.gradcam import CamMaps
from ..inspectors.logitlens import LogitLens
from ..workbench import PatchGrid
from .ablation_io import AblationRequest, Answered

__all__ = ["Ablates", "AttributionClicks", "CamClicks", "PatchClicks", "SteerClicks"]


@runtime_checkable
class Ablates(Protocol):
    """Every ablation click, the attention view's heads, the feature-map view's channels and the
    thermometer's rows: one request, one answer (:mod:`nbdebug.sessions.ablation_io`)."""

    def respond(self, request: AblationRequest) -> Answered: ...


@runtime_checkable
class PatchClicks(Protocol):
    """The patching view's grid and cell requests, and what it shows of the two recorded runs."""

    metric_label: str
    metric_clean: float
    metric_corrupt: float
    tokens_clean: list[str]
    tokens_corrupt: list[str]
    top_clean: list[dict[str, Any]]
    top_corrupt: list[dict[str, Any]]

    def grid(self, sites: str = "resid", method: str = "exact") -> PatchGrid: ...

    def cell(self, sites: str, method: str, row: int, col: int, k: int = 5) -> dict[str, Any]: ...


@runtime_checkable
class SteerClicks(Protocol):
    """The lens view's steering panel: the layers offered, the first shown, the steered lens."""

    default: str
    runs: int

    @property
    def layers(self) -> list[str]: ...

    def lens(self, layer: str, alpha: float) -> LogitLens: ...


@runtime_checkable
class CamClicks(Protocol):
    """The Grad-CAM view's layer picker: the maps of another layer, same target classes."""

    def maps_for(self, name: str) -> CamMaps: ...


@runtime_checkable
class AttributionClicks(Protocol):
    """The token-attribution view's method switch and generated-token picks (each computed once)."""

    steps: int
    fix_first: bool
    tokenizer: Any
    generated: list[int]
    results: dict[tuple[str, int, bool, int | None], Attribution]

    def get(self, method: str, steps: int | None = None, fix_first: bool | None = None,
            pick: int | None = None) -> Attribution: ...
