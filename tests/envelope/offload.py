"""Offloaded models in the real-use matrix: a tiny random Llama that accelerate spreads over the CPU
and disk (``nbdebug.testing.offloaded_llama``: block 0 and the embeddings on the CPU, block 1, the
final norm and ``lm_head`` on disk, their weights on ``meta`` until accelerate's hooks load them).

Each cell runs through ``%%nndebug`` in a fresh IPython shell, once on the offloaded model and once on
the same checkpoint loaded without offload (the reference), and checks: the view's content with the
matrix's own checks (``checks.check``, against the reference model's activations, attention and
logits), the view equal to the reference's view, our hooks gone, accelerate's hooks (``_hf_hook``)
and device map kept, every offloaded weight back on ``meta``, parameters/buffers/``.grad``/modes
unchanged (``fingerprint``), the cell's output equal to the reference's, the RNG untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from nbdebug.capture import fingerprint, hook_count, same_fingerprint

from . import models as M
from .usercode import Outcome, reference_activations, same_output, user_code, view_name

#: the table's row → what the cell does (the mode the matrix's checks know it by)
MODES = {"offloaded": "no_grad", "offloaded_generate": "generate"}
VIEWS = ["thermometer[llama]", "attention[llama]", "logitlens[llama]", "all[llama]"]
CELLS = {
    "no_grad": "with torch.no_grad():\n    out = model(ids)",
    "generate": "out = model.generate(ids, max_new_tokens=M.NEW_TOKENS, do_sample=False, pad_token_id=0)",
}
ALL_VIEWS = ("thermometer", "featuremaps", "gradcam", "attention", "logitlens")


def accelerate_state(m: nn.Module) -> dict[str, Any]:
    """What the cell must leave as it was: accelerate's map and hooks (the same objects, still wrapping
    ``forward``), where every weight lives, the hook count; and the fingerprint (offloaded weights
    read through accelerate's stored copy)."""
    return {
        "map": dict(m.hf_device_map),
        "accelerate_hooks": {n: id(mod._hf_hook) for n, mod in m.named_modules() if hasattr(mod, "_hf_hook")},
        "wrapped_forward": sorted(n for n, mod in m.named_modules() if hasattr(mod, "_old_forward")),
        "devices": {n: p.device.type for n, p in m.named_parameters()},
        "hooks": hook_count(m),
        "fingerprint": fingerprint(m),
    }


def same_state(before: dict[str, Any], after: dict[str, Any]) -> None:
    for key in before:
        if key != "fingerprint":
            assert after[key] == before[key], f"{key} changed: {before[key]} -> {after[key]}"
    diffs = same_fingerprint(before["fingerprint"], after["fingerprint"])
    assert diffs == [], f"model state changed: {diffs}"


class MagicRun:
    """What :func:`checks.check_all` reads from a ``Debug``, rebuilt from what ``%%nndebug --view all``
    left in the namespace (``_nndebug``: view → result; ``_nndebug_widget``: the dashboard)."""

    def __init__(self, ns: dict[str, Any]) -> None:
        self.results: dict[str, Any] = dict(ns["_nndebug"] or {})
        dash = ns["_nndebug_widget"]
        self._widgets = dict(dash.views)
        self._note = "; ".join(dash.notes)
        self.skipped = {v: self._note for v in ALL_VIEWS if v not in self.results and v in self._note}

    @property
    def views(self) -> list[str]:
        return list(self._widgets)

    def widgets(self) -> list[Any]:
        return list(self._widgets.values())

    def note(self) -> str:
        return self._note


def magic_cell(shell: Any, model: nn.Module, kind: str, view: str) -> tuple[Any, Outcome, MagicRun | None]:
    """Run the cell through ``%%nndebug model --view VIEW`` with ``model``; (its ``out``, the outcome, the run for ``all``)."""
    shell.user_ns.update(model=model, ids=M.prompt(), torch=torch, M=M)
    v = view_name(view)
    shell.displayed.clear()
    r = shell.run_cell(f"%%nndebug model --view {v}\n{CELLS[kind]}")
    assert r.success, r.error_in_exec
    ns = shell.user_ns
    if v == "all":
        run = MagicRun(ns)
        return ns["out"], Outcome(view, result=run.results), run
    result, widget = ns["_nndebug"], ns["_nndebug_widget"]
    if result is None:  # the note the magic displayed in the view's place
        notes = [str(d.get("text/plain", "")) for d in shell.displayed if "not shown" in str(d.get("text/plain", ""))]
        return ns["out"], Outcome(view, note=" ".join(notes)), None
    return ns["out"], Outcome(view, result=result, widget=widget), None


def close_shown(shell: Any) -> None:
    w = shell.user_ns.get("_nndebug_widget")
    for child in getattr(w, "views", {}).values():
        child.close()
    if w is not None:
        w.close()


def same_view(v: str, got: Any, want: Any) -> None:
    """The offloaded model's view equals the view of the same checkpoint loaded without offload."""
    if v == "thermometer":
        assert [r.name for r in got.layers] == [r.name for r in want.layers]
        for a, b in zip(got.layers, want.layers):
            keys = sorted(b.stats)
            np.testing.assert_allclose([a.stats[k] for k in keys], [b.stats[k] for k in keys], rtol=1e-5, atol=1e-6, err_msg=a.name)
    elif v == "attention":
        assert got.shape == want.shape, (got.shape, want.shape)
        for key in want.metrics:
            np.testing.assert_allclose(got.metrics[key], want.metrics[key], atol=1e-5, err_msg=key)
        L, H, _ = want.shape
        for i in range(L):
            for h in range(H):
                np.testing.assert_allclose(got.head(i, h), want.head(i, h), atol=1e-5, err_msg=f"layer {i} head {h}")
    elif v == "logitlens":
        assert list(got.row_names) == list(want.row_names)
        np.testing.assert_array_equal(got.top_ids, want.top_ids)
        for key in ("top_probs", "entropy", "kl"):
            np.testing.assert_allclose(getattr(got, key), getattr(want, key), atol=1e-5, err_msg=key)
    else:
        assert set(got) == set(want), (list(got), list(want))
        for sub in want:
            same_view(sub, got[sub], want[sub])


def run_offloaded(shell: Any, mode: str, view: str, model: nn.Module, ref: nn.Module, check: Callable[..., None]) -> Outcome:
    """One cell on the offloaded ``model`` (``ref``: the same checkpoint without offload); see the module doc."""
    from .checks import widget_count

    kind = MODES[mode]
    ids = M.prompt()
    acts = reference_activations(ref, lambda m: user_code(kind, "llama", m, ids))
    torch.manual_seed(0)
    ref_out = user_code(kind, "llama", ref, ids)  # the cell without nbdebug
    rng = torch.get_rng_state()
    _, want, _ = magic_cell(shell, ref, kind, view)  # the same view of the model not offloaded
    close_shown(shell)
    widgets_before = widget_count()
    before = accelerate_state(model)
    assert before["accelerate_hooks"] and set(before["map"].values()) == {"cpu", "disk"}, before["map"]
    assert model.lm_head.weight.device.type == "meta"  # the premise: weights only exist inside accelerate's hooks
    torch.manual_seed(0)
    out, res, run = magic_cell(shell, model, kind, view)
    assert torch.equal(torch.get_rng_state(), rng), "nbdebug consumed random numbers: the user's next draws differ"
    same_output(kind, out, ref_out, True)
    ctx = dict(mode=kind, view=view, family="llama", lm=True, model=model, ref=ref, inp=ids, out=out, ref_out=ref_out,
               acts=acts, dbg=run, user={}, widgets_before=widgets_before)
    check(res, ctx)
    same_view(view_name(view), res.result, want.result)
    close_shown(shell)
    same_state(before, accelerate_state(model))
    return res
