"""The attribution view: the headline (:func:`~nbdebug.inspectors.token_headlines.attribution_headline`:
the finding, or that the scores are no better than random / do not add up, with the next method offered),
the input tokens coloured by their score (the patching view's scale: blue pushes the answer over the wrong
token, red the other way), a method switch answered by the kernel on demand
(``@rpc("attribution")``), the deletion curve against the mean of random orders, and integrated
gradients' completeness gap with a "more steps" / "keep the first token" hint when it misses by more
than 5 %. After ``generate()`` the generated tokens are listed (``generated``); clicking one asks the
kernel for that token as the answer over its prefix (``pick``; -1: the ``--answer`` over the prompt).

Synced state is one attribution as JSON (``data``: tokens, scores, curves; a few KB), the method shown
and the methods offered. Tokens are model text: ``textContent`` in the browser, escaped here.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import traitlets

from ..attribution import Attribution
from ..attribution.methods import METHODS
from ..inspectors.token_headlines import attribution_headline
from ..sessions.protocols import AttributionClicks
from ..workbench.metric import token_labels
from ._base import NBWidget, rpc
from ._snapshot import code_html
from .patching import diverging

__all__ = ["AttributionWidget", "diverging_rgb"]


def diverging_rgb(t: float) -> tuple[int, int, int]:
    """Red (t = −1: against the answer) → white (0) → blue (+1: toward it), clamped: the patching view's
    scale (:func:`nbdebug.widgets.patching.diverging`), so one colour means "toward the answer" in both."""
    return diverging(float(t) if np.isfinite(t) else 0.0)


def _data(result: Attribution) -> dict[str, Any]:
    """What the browser draws: the attribution, its headline and the method it offers."""
    d = result.to_dict()
    headline, advice = attribution_headline(d)
    return {**d, "headline": headline, "advice": advice}


class AttributionWidget(NBWidget):
    """Tokens coloured by score, the method switch, curves and the completeness warning.

    Traits: ``data`` (the shown :meth:`Attribution.to_dict`), ``method`` (the method shown; the
    browser's switch asks the kernel, which sets it), ``methods``. ``result`` is the shown
    :class:`Attribution`; ``session`` computes the others (the model held weakly)."""

    _view_name_ = "attribution"

    data = traitlets.Dict().tag(sync=True)
    #: the method the headline offers when the shown one cannot be read (``{"method", "fix_first", "text"}``)
    advice = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)
    method = traitlets.Unicode("grad_x_input").tag(sync=True)
    methods = traitlets.List(traitlets.Unicode(), default_value=list(METHODS)).tag(sync=True)
    #: the view's integrated-gradients steps and baseline option (what the switch asks for by default)
    steps = traitlets.Int(64).tag(sync=True)
    fix_first = traitlets.Bool(False).tag(sync=True)
    #: the generated tokens (labels; empty without a generation) and the one shown as the answer (-1: --answer)
    generated = traitlets.List(traitlets.Unicode()).tag(sync=True)
    pick = traitlets.Int(-1).tag(sync=True)

    def __init__(self, result: Attribution, session: AttributionClicks | None = None, **kwargs: Any) -> None:
        steps = getattr(session, "steps", result.steps or 64)
        fix_first = getattr(session, "fix_first", "first token fixed" in result.baseline)
        gen = list(getattr(session, "generated", []) or [])
        labels = token_labels(getattr(session, "tokenizer", None), gen) if gen else []
        data = _data(result)
        super().__init__(data=data, headline=data["headline"], advice=data["advice"], method=result.method, steps=steps,
                         fix_first=fix_first, generated=labels, **kwargs)
        self.result = result
        self.session = session

    @rpc("attribution")
    def _attribution(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The attribution by ``method`` (``steps``, ``fix_first`` optional) of ``pick`` (the k-th
        generated token as the answer; -1 or absent: the view's current pick), computed on first request."""
        method = str(params.get("method") or self.method)
        pick = int(params["pick"]) if params.get("pick") is not None else self.pick
        if self.session is None:
            if method != self.result.method or pick != self.pick:
                raise ValueError(f"only {self.result.method} was computed (no model to run {method})")
            res = self.result
        else:
            steps = params.get("steps")
            fix = params.get("fix_first")
            res = self.session.get(method, int(steps) if steps else None, None if fix is None else bool(fix),
                                   None if pick < 0 else pick)
        self.result = res
        data = _data(res)
        self.method, self.pick, self.headline, self.advice = res.method, pick, data["headline"], data["advice"]
        return data, {}

    def fallback_html(self) -> str:
        """Static snapshot: the tokens coloured by score, the completeness line and the AUCs."""
        r = self.result
        peak = float(np.abs(r.scores).max()) if len(r.scores) else 0.0
        spans = []
        for tok, s in zip(r.tokens, r.scores):
            rgb = diverging_rgb(s / peak if peak > 0 else 0.0)
            fg = "#000" if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 140 else "#fff"
            spans.append(f"<span title='{float(s):+.4g}' style='background:rgb{rgb};color:{fg};padding:1px 2px;"
                         f"white-space:pre'>{html.escape(tok)}</span>")
        lines = [f"<p class='nbd-headline'><b>{code_html(self.headline)}</b></p>",
                 f"<p>nbdebug attribution · {html.escape(r.method)} · {html.escape(r.label)} = {r.metric:.2f} "
                 "(blue: toward the answer, red: against it)</p>", f"<p>{''.join(spans)}</p>"]
        if r.delta is not None:
            rel = r.relative_delta or 0.0
            lines.append(f"<p>completeness: delta {r.delta:+.4g} ({rel:.1%} of m(x) − m(baseline))"
                         f"{'' if r.converged else ' — NOT converged: more steps or fix_first=True'}</p>")
        if r.faithfulness:
            lines.append(f"<p>deletion AUC {r.faithfulness['deletion']:.3f} (lower is better) vs random "
                         f"{r.faithfulness['random']:.3f}</p>")
        lines += [f"<p>{html.escape(n)}</p>" for n in r.notes]
        return "<div class='nbdebug-attribution-static'>" + "".join(lines) + "</div>"

    def export_requests(self) -> list[tuple[str, dict[str, Any]]]:
        """Every method already computed (a saved page switches between those)."""
        if self.session is None:
            return [("attribution", {"method": self.result.method})]
        gen = bool(self.session.generated)  # the browser sends a pick only after a generation
        return [("attribution", {"method": m, "steps": s, "fix_first": f, **({"pick": -1 if k is None else k} if gen else {})})
                for (m, s, f, k) in self.session.results]

    def __repr__(self) -> str:
        return f"AttributionWidget({self.result!r})"
