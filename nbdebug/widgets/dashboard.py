"""The dashboard: several views of one run in tabs, with their selections linked in Python.

>>> dash = Dashboard({"thermometer": t, "featuremaps": f, "gradcam": g})   # doctest: +SKIP
>>> t.selected = "features.3"          # featuremaps/gradcam switch to features.3 when they have it
>>> dash.selection = {"view": "thermometer", "layer": "features.3"}       # the same, from Python

Linking is done here with traitlets observers on the views' synced traits, so it works whether a
change comes from a click in the browser or from Python, and no view's front-end knows another:

- thermometer ``selected`` (a row) → featuremaps ``layer`` and gradcam ``layer`` (same module);
- logit lens ``pinned`` (the newest pinned cell's position, i.e. the column clicked) → attention
  ``highlight_token``;
- attention ``selected`` (the first head) → thermometer ``selected``: a row of that head's block.

``selection`` mirrors the last linked selection as ``{"view": ..., "layer"/"token"/"head": ...}``;
setting it drives the views.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator, Mapping
from typing import Any

import ipywidgets
import traitlets

__all__ = ["Dashboard", "ViewNote"]

#: how a note looks: quiet (small, grey), one line; it is information, not a warning (#595959 on
#: white: 7:1, WCAG AA; it wraps rather than being cut in a narrow notebook)
NOTE_STYLE = "color:#595959;font-size:0.85em;margin:2px 0;overflow-wrap:anywhere"

_ROW_SUFFIX = re.compile(r"(\[\d+\])+$")  # thermometer rows of tuple outputs: "block.attn[0]"


def _block_prefix(name: str) -> str:
    """``transformer.h.3.attn`` → ``transformer.h.3`` (up to the last numeric part; else the name)."""
    parts = name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].isdigit():
            return ".".join(parts[: i + 1])
    return name


#: the tab titles at WCAG AA contrast: JupyterLab draws an inactive tab's title in its secondary text
#: colour on its grey tab bar (4:1); this rule, scoped to the dashboard, darkens it (a constant string)
TAB_STYLE = ("<style>.nbdebug-dashboard .lm-TabBar-tab:not(.lm-mod-current), "
             ".nbdebug-dashboard .lm-TabBar-tab:not(.lm-mod-current) .lm-TabBar-tabLabel "
             "{ color: color-mix(in srgb, var(--jp-ui-font-color1, #222) 86%, transparent) !important; }</style>")


def _note_html(notes: list[str]) -> str:
    return "".join(f"<div class='nbdebug-note' style='{NOTE_STYLE}'>{html.escape(n)}</div>" for n in notes)


class ViewNote:
    """A one-line note displayed where a view would be ("not shown: gradcam (no layer has a spatial
    output)"): plain HTML and text in the output, no widget (nothing to open or close in the front-end).

    >>> ViewNote("not shown: gradcam (no image)")
    not shown: gradcam (no image)
    """

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_html_(self) -> str:
        return _note_html([self.text])

    def __repr__(self) -> str:
        return self.text


class Dashboard(ipywidgets.VBox):
    """One tab per view (``views``: name → widget, ``tab``: the Tab), selections linked in Python.

    ``notes`` (a quiet line above the tabs) says what was left out and why, e.g. views that do not
    apply to the model.
    """

    #: last linked selection, e.g. ``{"view": "thermometer", "layer": "features.3"}``; set it to drive the views
    selection = traitlets.Dict().tag(sync=True)
    notes = traitlets.List(traitlets.Unicode()).tag(sync=True)

    def __init__(self, views: Mapping[str, Any], notes: list[str] | None = None, **kwargs: Any) -> None:
        self.views: dict[str, Any] = dict(views)
        self.tab = ipywidgets.Tab(children=list(self.views.values()))
        self.tab.titles = tuple(self.views)
        self._note_box = ipywidgets.HTML(TAB_STYLE + _note_html(list(notes or [])))
        super().__init__(children=[self._note_box, self.tab], notes=list(notes or []), **kwargs)
        self.add_class("nbdebug-dashboard")
        self._busy = False
        self._link()

    # -- linking --------------------------------------------------------------------------------
    def _link(self) -> None:
        v = self.views
        if "thermometer" in v:
            v["thermometer"].observe(self._on_thermometer, names="selected")
        if "logitlens" in v:
            v["logitlens"].observe(self._on_lens, names="pinned")
        if "attention" in v:
            v["attention"].observe(self._on_attention, names="selected")
        self.observe(self._on_selection, names="selection")

    def _set_selection(self, value: dict[str, Any]) -> None:
        busy, self._busy = self._busy, True
        try:
            self.selection = value
        finally:
            self._busy = busy

    def _module_candidates(self, row: str) -> list[str]:
        """Names a thermometer row may have in the vision views: itself, its module, without ``[i]``."""
        names = [row, _ROW_SUFFIX.sub("", row)]
        therm = self.views.get("thermometer")
        for lay in getattr(therm, "layers", []) or []:
            if lay.get("name") == row and lay.get("module"):
                names.append(str(lay["module"]))
        names += [n.split("#")[0] for n in names]
        return list(dict.fromkeys(names))

    def open_layer(self, row: str) -> dict[str, str]:
        """Switch the feature grid and Grad-CAM to the module of thermometer row ``row`` where they
        have it; returns ``{view: layer}`` of the views that switched."""
        switched: dict[str, str] = {}
        cands = self._module_candidates(row) if row else []
        fm = self.views.get("featuremaps")
        if fm is not None:
            have = [lay["name"] for lay in fm.layers]
            hit = next((c for c in cands if c in have), None)
            if hit is not None:
                if fm.layer != hit:
                    fm.selected = -1
                fm.layer = hit
                switched["featuremaps"] = hit
        gc = self.views.get("gradcam")
        if gc is not None:
            hit = next((c for c in cands if c in gc.layers), None)
            if hit is not None:
                gc.layer = hit
                switched["gradcam"] = hit
        return switched

    def _on_thermometer(self, change: dict[str, Any]) -> None:
        row = str(change["new"] or "")
        self.open_layer(row)
        if not self._busy:  # a head click reports itself (below)
            self._set_selection({"view": "thermometer", "layer": row})

    def _on_lens(self, change: dict[str, Any]) -> None:
        old = {tuple(p) for p in (change["old"] or [])}
        new = [tuple(p) for p in (change["new"] or [])]
        added = [p for p in new if p not in old]
        if not added:
            return
        pos = int(added[-1][1])
        att = self.views.get("attention")
        if att is not None and 0 <= pos < att.seq_len:
            att.highlight_token = pos
        self._set_selection({"view": "logitlens", "token": pos})

    def thermometer_row_for_block(self, layer: int) -> str | None:
        """The thermometer row of attention layer ``layer``'s block: its attention module's row (or
        its first inner row), else the block's own row, else the first row under the block
        (``transformer.h.3.*``); None if there is none."""
        att, therm = self.views.get("attention"), self.views.get("thermometer")
        if att is None or therm is None or not 0 <= layer < len(att.layer_names):
            return None
        name = str(att.layer_names[layer])
        block = _block_prefix(name)
        rows = [str(r["name"]) for r in therm.layers]
        def exact(want: str) -> str | None:
            return next((r for r in rows if r == want or _ROW_SUFFIX.sub("", r).split("#")[0] == want), None)

        def under(prefix: str) -> str | None:
            return next((r for r in rows if r.startswith(prefix)), None)

        # the attention module's own row or its first inner row, then the block's own output row
        # (captured for transformers: the residual stream), then the block's first inner row
        return exact(name) or under(name + ".") or exact(block) or under(block + ".")

    def _on_attention(self, change: dict[str, Any]) -> None:
        sel = change["new"] or []
        if not sel:
            return
        layer, head = (int(x) for x in sel[0])
        row = self.thermometer_row_for_block(layer)
        busy, self._busy = self._busy, True
        try:
            if row is not None:
                self.views["thermometer"].selected = row
        finally:
            self._busy = busy
        self._set_selection({"view": "attention", "layer": layer, "head": head, **({"row": row} if row else {})})

    @traitlets.validate("selection")
    def _check_selection(self, proposal: Any) -> dict[str, Any]:
        sel = dict(proposal["value"] or {})
        if sel and sel.get("view", "thermometer") not in self.views:
            raise traitlets.TraitError(f"selection {sel!r}: no such view in this dashboard ({', '.join(self.views)})")
        return sel

    def _on_selection(self, change: dict[str, Any]) -> None:
        if self._busy:
            return
        sel = dict(change["new"] or {})
        view = sel.get("view", "thermometer")
        v = self.views
        if view == "thermometer" and "thermometer" in v:
            v["thermometer"].selected = str(sel.get("layer") or "")
        elif view in ("featuremaps", "gradcam") and view in v and "layer" in sel:
            self.open_layer(str(sel["layer"]))
        elif view == "attention" and "attention" in v and "head" in sel:
            v["attention"].selected = [[int(sel.get("layer", 0)), int(sel["head"])]]
        elif view in ("logitlens", "attention") and "token" in sel and "attention" in v:
            v["attention"].highlight_token = int(sel["token"])

    # -- output ---------------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
        if data is None:
            return bundle
        data = dict(data)
        parts = [f"<h4>{html.escape(n)}</h4>{w.safe_fallback_html()}" for n, w in self.views.items() if hasattr(w, "safe_fallback_html")]
        data["text/html"] = ("<div class='nbdebug-dashboard-static'><b>nbdebug dashboard</b>: " + html.escape(", ".join(self.views))
                             + _note_html(list(self.notes)) + "".join(parts) + "</div>")
        data["text/plain"] = repr(self)
        return data, meta

    def close(self) -> None:
        """Close the dashboard, every view in it, the tabs and the notes (with their layouts/styles)."""
        parts = [self._trait_values.get(k) for k in ("layout", "style")]
        for w in [*self.views.values(), self._note_box, self.tab]:
            parts += [w._trait_values.get(k) for k in ("layout", "style")]
            w.close()
        super().close()
        for part in parts:
            if isinstance(part, ipywidgets.Widget):
                part.close()

    def __iter__(self) -> Iterator[Any]:
        """The views' widgets in tab order (as the magic's list of widgets used to be)."""
        return iter(list(self.views.values()))

    def __getitem__(self, key: int | str) -> Any:
        """A view's widget by name (``dash["gradcam"]``) or tab index."""
        return self.views[key] if isinstance(key, str) else list(self.views.values())[key]

    def __repr__(self) -> str:
        return f"Dashboard({', '.join(self.views)})"
