"""The logit-lens table: rows = layers, columns = positions, each cell the top-1 token.

>>> w = LogitLensWidget(rec.lens())          # doctest: +SKIP
>>> w.metric = "entropy"                     # doctest: +SKIP

Synced up front: the finding (from which block the answer at the last position is top-1 and stays,
:mod:`nbdebug.inspectors.lens_finding`), row names, token labels (the targets' text too: no raw ids
where a tokenizer was given) and the columns already computed (the last position, every row) as
binary arrays. The browser asks for the other positions with the ``columns``
request (computed then, cached), and for a pinned cell's longer top-k with ``cell``.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import traitlets

from ..inspectors.attention import display_token
from ..inspectors.events import fmt_p
from ..inspectors.lens_finding import layer_rows, lens_headline
from ..inspectors.logitlens import LogitLens
from ..sessions.protocols import SteerClicks
from ._base import NBWidget, rpc
from ._snapshot import code_html, css_color, lut
from ._transport import encode_array

#: shown in the steering panel's place when the view has no ``--steer`` vector
STEER_HINT = ("steer this lens: v = nbdebug.steering_vector(model, tokenizer=tok, positive=[...], negative=[...], "
              "layer='<block name>'), then add --steer v to the magic line")

__all__ = ["STEER_HINT", "LogitLensWidget", "text_on"]

METRICS = ("top1_prob", "entropy", "target_prob", "target_rank", "kl")


def _lens_name(fitted: Any) -> str:
    """``"logit lens"`` for ``None``, else the fitted lens's name (``"tuned lens"``, ``"tuned lens (folder)"``)."""
    return "logit lens" if fitted is None else str(fitted.name)


def text_on(rgb: tuple[int, int, int] | np.ndarray) -> str:
    """``#000`` or ``#fff``, whichever has the higher WCAG contrast on ``rgb`` (as ``lib/contrast.ts``)."""
    c = np.asarray(rgb, np.float64) / 255
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    lum = float(lin @ np.array([0.2126, 0.7152, 0.0722]))
    return "#000" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "#fff"


def _pack(cols: dict[str, np.ndarray]) -> dict[str, Any]:
    """Arrays of some columns in wire form: top ids int32, the rest float32 (rank as int32)."""
    return {
        "top_ids": cols["top_ids"].astype(np.int32),
        "top_probs": cols["top_probs"].astype(np.float32),
        "entropy": cols["entropy"].astype(np.float32),
        "kl": cols["kl"].astype(np.float32),
        "target_prob": cols["target_prob"].astype(np.float32),
        "target_rank": cols["target_rank"].astype(np.int32),
    }


class LogitLensWidget(NBWidget):
    """Logit-lens table with metric switch, hover top-k, pinned cells and a layer-range filter.

    Traits: ``row_names``, ``tokens`` (readable labels), ``raw_tokens``, ``k``, ``n_rows``,
    ``n_pos``, ``initial`` (``{positions, arrays{name: wire array}}`` for the columns computed up
    front), ``vocab`` (``{id: label}`` for ids in ``initial``), ``targets`` (per-position target
    ids), ``target_label``, ``check``, ``notes``, ``generated`` (per position: 1 if ``generate()``
    produced that token), ``finding`` (the header sentence) and ``finding_cell`` (its numbers:
    ``position``, ``answer_id``, ``from_row``, ``first_row``, ``predicted_id``, ``predicted_from_row``).
    Columns and cells not computed yet need the model: once it is deleted they
    answer with the ``ModelGoneError`` message (the lens holds the model weakly). UI state synced both ways: ``metric``,
    ``row_range`` (``[first, last]``), ``pos_range`` (``[start, end)`` of visible positions),
    ``pinned`` (list of ``[row, pos]``). ``steering`` (a :class:`~nbdebug.sessions.steer.SteerLens`,
    from ``--steer``): the steering panel's ``steer_layers``/``steer_layer`` and the ``steer`` request
    (``{layer, alpha, start, end}`` → the steered run's columns and both runs' next-token top-5);
    without it ``steer_hint`` says how to make a vector.
    """

    _view_name_ = "logitlens"

    row_names = traitlets.List(traitlets.Unicode()).tag(sync=True)
    tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)
    raw_tokens = traitlets.List(traitlets.Unicode()).tag(sync=True)
    k = traitlets.Int(10).tag(sync=True)
    n_rows = traitlets.Int(0).tag(sync=True)
    n_pos = traitlets.Int(0).tag(sync=True)
    initial = traitlets.Dict().tag(sync=True)
    vocab = traitlets.Dict().tag(sync=True)
    targets = traitlets.List(traitlets.Int()).tag(sync=True)
    target_label = traitlets.Unicode("").tag(sync=True)
    check = traitlets.Unicode("").tag(sync=True)
    #: the header's first line: from which block the answer is top-1 and stays
    finding = traitlets.Unicode("").tag(sync=True)
    #: the finding's numbers (LensFinding.to_json): the view marks that cell
    finding_cell = traitlets.Dict().tag(sync=True)
    notes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    #: per position, 1 when generate() produced the token (empty: no generation)
    generated = traitlets.List(traitlets.Int()).tag(sync=True)
    metric = traitlets.Enum(METRICS, default_value="top1_prob").tag(sync=True)
    row_range = traitlets.List(traitlets.Int()).tag(sync=True)
    pos_range = traitlets.List(traitlets.Int()).tag(sync=True)
    pinned = traitlets.List().tag(sync=True)
    #: the steering panel (``--steer``): the layers offered, the one shown first, the slider's bound
    steer_layers = traitlets.List(traitlets.Unicode()).tag(sync=True)
    steer_layer = traitlets.Unicode("").tag(sync=True)
    steer_max = traitlets.Float(8.0).tag(sync=True)
    #: without ``--steer``: one line on how to make a steering vector
    steer_hint = traitlets.Unicode("").tag(sync=True)
    #: steered runs the kernel has computed (for tests)
    steer_runs = traitlets.Int(0).tag(sync=True)
    #: the lens shown ("logit lens", "tuned lens", …) and the one compared with it ("" : none)
    lens_name = traitlets.Unicode("logit lens").tag(sync=True)
    compare_name = traitlets.Unicode("").tag(sync=True)
    #: the by-layer strip at the finding's position (:func:`~nbdebug.inspectors.lens_finding.layer_rows`)
    by_layer = traitlets.List().tag(sync=True)
    #: positions whose KL the strip's "this prompt" column averages
    kl_positions = traitlets.List(traitlets.Int()).tag(sync=True)

    def __init__(self, lens: LogitLens, *, window: int = 48, steering: SteerClicks | None = None, other: LogitLens | None = None,
                 fitted: tuple[Any, Any] = (None, None), kl_window: int = 1, **kwargs: Any) -> None:
        self.lens = lens
        self.other = other
        self.steering = steering
        if steering is not None:
            kwargs.update(steer_layers=steering.layers, steer_layer=steering.default)
        else:
            kwargs.setdefault("steer_hint", STEER_HINT)
        done = [int(i) for i in np.flatnonzero(lens.done)] or [lens.T - 1]
        cols = lens.columns(done)
        found = lens.finding()
        names = [_lens_name(fitted[0]), _lens_name(fitted[1])]
        strip, kl_pos = self._strip(lens, other, found.position, fitted, kl_window)
        named = [(names[0], found)] + ([(names[1], other.finding())] if other is not None else [])
        kwargs.setdefault("headline", lens_headline(named, lens.R))
        kwargs.update(lens_name=names[0], compare_name=names[1] if other is not None else "", by_layer=strip, kl_positions=kl_pos)
        T = lens.T
        targets = [int(t) for t in lens.targets.tolist()]
        lens.learn(targets)  # the tip names each position's target: its text, not its id
        super().__init__(
            row_names=list(lens.row_names),
            tokens=[display_token(t) for t in lens.tokens],
            raw_tokens=list(lens.tokens),
            k=lens.k,
            n_rows=lens.R,
            n_pos=T,
            initial={"positions": done, "arrays": {k: encode_array(v) for k, v in _pack(cols).items()}},
            vocab=self._labels({**lens.vocab_for(done), **{i: lens.vocab[i] for i in set(targets) if i in lens.vocab}}),
            targets=targets,
            finding=found.sentence,
            finding_cell=found.to_json(),
            target_label=lens.target_label,
            generated=[int(g) for g in lens.generated],
            row_range=[0, lens.R - 1],
            pos_range=[max(0, T - window), T],
            **kwargs,
        )

    @staticmethod
    def _strip(lens: LogitLens, other: LogitLens | None, position: int, fitted: tuple[Any, Any],
               kl_window: int) -> tuple[list[dict[str, Any]], list[int]]:
        """The by-layer strip at ``position``: this lens's rows, KL on this prompt (mean over its last
        ``kl_window`` positions; 1: the strip's own position, the column the view computes first, so
        nothing more is computed up front) and on held-out text, and the compared lens's top-1."""
        kl_pos = list(range(max(0, lens.T - kl_window), lens.T))
        c = lens.columns(kl_pos)
        j = kl_pos.index(position % lens.T)
        held = (fitted[0].quality.get("lens") if fitted[0] is not None else None)
        if held is None and other is not None and fitted[1] is not None:
            held = fitted[1].quality.get("logit")  # the logit lens measured next to the compared one
        other_top = None
        if other is not None:
            oc = other.columns(kl_pos)
            other_top = oc["top_ids"][:, j, 0]
            lens.learn([int(i) for i in other_top])
        return layer_rows(lens.row_names, c["top_ids"][:, j, 0], c["top_probs"][:, j, 0], c["target_prob"][:, j],
                          c["target_rank"][:, j], lens.vocab, kl_prompt=np.nanmean(c["kl"], axis=1),
                          kl_heldout=held, other_top1=other_top), kl_pos

    @staticmethod
    def _labels(vocab: dict[int, str]) -> dict[str, str]:
        return {str(i): display_token(s) for i, s in vocab.items()}

    @rpc("columns")
    def _columns(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        T = self.lens.T
        start = max(0, int(params.get("start", 0)))
        end = min(T, int(params.get("end", T)))
        pos = list(range(start, end))
        if not pos:
            return {"positions": [], "vocab": {}}, {}
        cols = self.lens.columns(pos)
        return {"positions": pos, "vocab": self._labels(self.lens.vocab_for(pos))}, _pack(cols)

    @rpc("steer")
    def _steer(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The lens of the run steered at ``layer`` by ``alpha`` (positions ``start..end``) and the
        next-token top-5 at the last position, steered and original (``alpha`` 0: the original run)."""
        if self.steering is None:
            raise ValueError(STEER_HINT)
        layer = str(params.get("layer") or self.steer_layer)
        alpha = float(params.get("alpha", 0.0))
        lens = self.lens if alpha == 0 else self.steering.lens(layer, alpha)
        self.steer_runs = self.steering.runs
        T = lens.T
        start, end = max(0, int(params.get("start", 0))), min(T, int(params.get("end", T)))
        pos = sorted(set(range(start, end)) | {T - 1})
        cols = lens.columns(pos)
        result = {"layer": layer, "alpha": alpha, "positions": pos, "vocab": self._labels(lens.vocab_for(pos)),
                  "top": {"steered": self._top5(lens), "original": self._top5(self.lens)}}
        return result, _pack(cols)

    def _top5(self, lens: LogitLens) -> list[dict[str, Any]]:
        ids, probs = lens.cell(lens.R - 1, lens.T - 1, 5)
        return [{"id": int(i), "token": display_token(lens.vocab[int(i)]), "p": float(p)} for i, p in zip(ids, probs)]

    @rpc("cell")
    def _cell(self, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        row, pos = int(params.get("row", 0)), int(params.get("pos", 0))
        if not (0 <= row < self.lens.R and 0 <= pos < self.lens.T):
            raise IndexError(f"no cell [{row}, {pos}]")
        k = max(1, min(int(params.get("k", 20)), 100))
        ids, probs = self.lens.cell(row, pos, k)
        labels = self._labels({int(i): self.lens.vocab[int(i)] for i in ids})
        return {"row": row, "pos": pos, "vocab": labels}, {"ids": ids.astype(np.int32), "probs": probs.astype(np.float32)}

    def fallback_html(self, max_positions: int = 12) -> str:
        """Static snapshot: the last visible positions as an HTML table coloured by top-1 probability."""
        lens = self.lens
        end = self.pos_range[1] if len(self.pos_range) == 2 else lens.T
        pos = list(range(max(0, end - max_positions), end))
        cols = lens.columns(pos)
        first, last = self.row_range if len(self.row_range) == 2 else (0, lens.R - 1)
        gen = list(lens.generated) + [False] * lens.T
        head = "".join(f"<th title='{p}: {html.escape(display_token(lens.tokens[p]))}{' (generated)' if gen[p] else ''}'"
                       + (" style='color:#8a3ffc;font-style:italic'" if gen[p] else "")
                       + f">{html.escape(display_token(lens.tokens[p])[:16])}</th>" for p in pos)
        body = []
        for r in range(last, first - 1, -1):  # last layer on top, as in the live view
            tds = []
            for j in range(len(pos)):
                tid, prob = int(cols["top_ids"][r, j, 0]), float(cols["top_probs"][r, j, 0])
                word = display_token(lens.vocab.get(tid, f"#{tid}"))
                fg = text_on(lut("viridis")[round(min(1.0, max(0.0, prob if np.isfinite(prob) else 0.0)) * 255)])
                tds.append(f"<td style='background:{css_color('viridis', prob)};color:{fg};padding:1px 4px' "
                           f"title='{html.escape(word)} p {fmt_p(prob)}'>{html.escape(word[:16])}</td>")
            body.append(f"<tr><th>{html.escape(lens.row_names[r])}</th>{''.join(tds)}</tr>")
        shown = f"positions {pos[0]}–{pos[-1]} of {lens.T}" if pos else "no positions"
        return (
            f"<div class='nbdebug-logitlens-static'><p><b>{code_html(self.headline or self.finding)}</b></p><p>nbdebug {html.escape(self.lens_name)}: top-1 token per layer and position, "
            f"coloured by its probability (viridis, 0–1) · {shown}</p>"
            f"<table style='border-collapse:collapse;font-family:monospace'><thead><tr><th>layer</th>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>"
        )

    def export_requests(self, max_cells: int = 2000) -> list[tuple[str, dict[str, Any]]]:
        """The visible window's missing columns (as the table asks for them) and its cells' top-20."""
        start, end = self.pos_range if len(self.pos_range) == 2 else (0, self.lens.T)
        have = set(self.initial.get("positions", []))
        missing = [p for p in range(start, end) if p not in have]
        out: list[tuple[str, dict[str, Any]]] = []
        if missing:
            out.append(("columns", {"start": min(missing), "end": max(missing) + 1}))
        cells = [(r, p) for p in range(end - 1, start - 1, -1) for r in range(self.lens.R)][:max_cells]
        out += [("cell", {"row": r, "pos": p, "k": 20}) for r, p in cells]
        return out

    def __repr__(self) -> str:
        return f"LogitLensWidget({self.lens_name}, {self.lens.R} rows × {self.lens.T} positions, top-{self.lens.k}; {self.headline})"
