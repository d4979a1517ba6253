"""What each view must show in each mode (called by :func:`cells.run` with the cell's context)."""

from __future__ import annotations

import copy
import math
import re
from typing import Any

import numpy as np
import torch

from . import models as M
from .cells import (
    LOOPS,
    NAN_STEP,
    RAISING,
    Outcome,
    close,
    logits,
    mode_context,
    one_line,
    view_name,
)

HALF = {"fp16", "bf16", "autocast"}
#: modes in which a view may legitimately not show (it must then leave a one-line note)
NOTE_OK = {
    ("dtype_error", "featuremaps"), ("dtype_error", "gradcam"),
    ("interrupt_in_forward", "gradcam"),
    ("exception", "gradcam"), ("keyboard_interrupt", "gradcam"), ("shape_error", "gradcam"),
    ("exception", "attention"), ("keyboard_interrupt", "attention"),
    ("exception", "logitlens"), ("keyboard_interrupt", "logitlens"),
}


def shown(res: Outcome) -> Any:
    """The view's widget: a view with a result must have one (a missing widget fails, it does not skip
    the widget's checks). Where a mode leaves no result, :func:`check` asserts the one-line note instead."""
    assert res.widget is not None, f"{res.view}: a result but no widget"
    return res.widget


def check(res: Outcome, ctx: dict[str, Any]) -> None:
    mode, view = ctx["mode"], ctx["view"]
    v = view_name(view)
    if v == "all":
        check_all(ctx)
        return
    if mode == "not_applicable":
        check_not_applicable(res, ctx)
        return
    if mode == "budget0":  # the budget is honoured and said; what is shown is as correct as without one
        check_budget(res, ctx)
        if res.result is None:
            return
    if res.result is None:  # only where the mode leaves nothing to show (a compiled model has no excuse)
        assert (mode, v) in NOTE_OK, f"view not shown: {res.note!r}"
        assert one_line(res.note), f"not a one-line note: {res.note!r}"
        if mode in RAISING or mode in ("shape_error", "dtype_error", "interrupt_in_forward"):  # the note says why: the cell raised, not a guess
            assert re.search(r"rais|interrupt|exception|error", res.note, re.I), f"the note does not say the model raised: {res.note!r}"
        return
    for n in getattr(res.result, "notes", []) or []:
        assert one_line(n), f"note is not one line: {n!r}"
    {"thermometer": check_thermometer, "featuremaps": check_featuremaps, "gradcam": check_gradcam,
     "attention": check_attention, "logitlens": check_logitlens}[v](res, ctx)


VIEWS = ("thermometer", "featuremaps", "gradcam", "attention", "logitlens")


def check_all(ctx: dict[str, Any]) -> None:
    """``view="all"``: every view that applies is shown and correct, as when it runs alone (views run
    together must not disturb each other); the others are one quiet note each."""
    dbg = ctx["dbg"]
    applies = ("thermometer", "attention", "logitlens") if ctx["lm"] else ("thermometer", "featuremaps", "gradcam")
    widgets = dict(zip(dbg.views, dbg.widgets()))
    for v in applies:
        sub = Outcome(v, result=dbg.results.get(v), widget=widgets.get(v), note=str(dbg.skipped.get(v, "")))
        check(sub, {**ctx, "view": f"{v}[{ctx['family']}]" if ctx["lm"] else v})
    for v in set(VIEWS) - set(applies):
        assert v not in dbg.results and one_line(str(dbg.skipped.get(v, ""))), (v, dbg.skipped.get(v))
    note = dbg.note()  # one line naming every view left out (several reasons: no length cap)
    assert note and "\n" not in note and "Traceback" not in note and all(v in note for v in set(VIEWS) - set(applies)), note


def _names_ok(names: list[str]) -> None:
    bad = [n for n in names if re.search(r"#[01]$", n) or "_orig_mod" in n]
    assert not bad, f"names outside the scheme (relu, relu#2 …): {bad}"


# -- thermometer ----------------------------------------------------------------------------
def cnn_rows(mode: str) -> list[str]:
    if mode == "int_outputs":
        return ["conv1", "bn", "relu", "conv2", "relu#2", "mask", "pool", "flat", "drop", "fc", "argmax"]
    if mode in RAISING:
        return ["conv1", "bn", "relu"]  # conv2's (user) hook raised: the rest never ran
    if mode == "interrupt_in_forward":
        return ["conv1", "bn", "relu", "conv2"]  # the forward itself stopped after conv2
    if mode == "shape_error":
        return ["conv", "relu", "flat"]
    return list(M.CNN_ROWS)


def same_value(got: float, want: float, tol: float) -> bool:
    """Equal within ``tol`` relative to 1 + |want|; a non-finite value only equals the same one (NaN == NaN)."""
    if math.isfinite(want) or math.isfinite(got):
        return abs(got - want) <= tol * (1 + abs(want))
    return (math.isnan(got) and math.isnan(want)) or got == want


def report_text(report: Any) -> str:
    return " ".join([report.summary, *(d.message for d in report.diagnoses), *report.notes])


def check_thermometer(res: Outcome, ctx: dict[str, Any]) -> None:
    from nbdebug.inspectors.thermometer import diagnose

    mode, cap = ctx["mode"], res.result
    names = [r.name for r in cap.layers]
    _names_ok(names)
    assert [r["name"] for r in shown(res).layers] == names
    report = diagnose(cap)
    # values: every row's mean equals the reference run's (plain hooks on a copy, cloned at hook time,
    # so an in-place ReLU after bn must not show up in bn's row); a loop's every step equals that forward's
    if not mode.startswith("generate"):
        tol = 2e-2 if mode in HALF else 1e-4
        if mode in LOOPS:
            steps = ctx["acts_steps"]
            assert cap.step_index.tolist() == list(range(1, len(steps) + 1)), cap.step_index
            per_step = []
            for s, acts in enumerate(steps, 1):
                rows = {r.name: r.stats["mean"] for r in cap.at(s)}
                assert sorted(rows) == sorted(names), (s, sorted(rows))
                per_step.append(rows)
                for name, got in rows.items():
                    assert name in acts, f"row {name!r} has no reference value at step {s}"
                    want = float(acts[name].float().mean())
                    assert same_value(got, want, tol), (s, name, got, want)
            for name in names:  # the whole run (the merged row): the mean of the steps' (equal-size) calls
                want = float(np.mean([r[name] for r in per_step]))
                if math.isfinite(want):
                    assert same_value(cap[name].stats["mean"], want, tol), (name, cap[name].stats["mean"], want)
        else:
            for name in names:
                ref = ctx["acts"].get(name)
                assert ref is not None, f"row {name!r} has no reference value (the run without nbdebug has none of that name)"
                got, want = cap[name].stats["mean"], float(ref.float().mean())
                assert same_value(got, want, tol), (name, got, want)
    if mode in HALF:  # histograms=True: exact, on the device, for every floating-point row
        for r in cap.layers:
            if r.dtype.startswith(("float", "bfloat")):
                assert r.histogram is not None and int(np.sum(r.histogram[0])) == int(r.stats["numel"]), (r.name, r.histogram)
    if ctx["lm"]:
        if mode in RAISING:  # the user's hook on the last block raised: it ran, lm_head did not
            last = "transformer.h.1.mlp.c_proj" if ctx["family"] == "gpt2" else "model.layers.1.mlp.down_proj"
            assert last in names and "lm_head" not in names, names
        else:
            assert "lm_head" in names, names
        assert not [n for n in names if "#" in n], f"extra rows (recomputation?): {[n for n in names if '#' in n]}"
        if mode.startswith("generate"):
            assert cap.forward_passes == M.NEW_TOKENS, cap.forward_passes
        if mode == "hf_ckpt":
            assert cap.backward_ran and cap["lm_head"].grad is not None
            assert len(names) == len(set(names))
        return
    if mode == "dtype_error":  # nothing ran: conv1 raised on its first input
        text = report_text(report)
        assert "`conv1`" in text and "float16" in text and "float32" in text, text
        return
    expected = cnn_rows(mode)
    if mode in RAISING or mode in ("shape_error", "interrupt_in_forward"):
        assert names[: len(expected)] == expected and "fc" not in names and "head" not in names[:3], names
    else:
        assert names == expected, names
    if mode == "train_step":
        assert cap.forward_passes == 3 and cap.backward_ran and cap["fc"].grad is not None
    if mode in ("ckpt_reentrant", "ckpt_nonreentrant"):
        assert cap.backward_ran and cap["relu#2"].grad is not None, "no gradient rows"
    if mode == "int_outputs":
        for row in ("mask", "argmax"):
            i = names.index(row)
            assert {"dead", "saturated"}.isdisjoint(report.flags[i]), (row, report.flags[i])
        assert cap["mask"].dtype == "bool" and cap["argmax"].dtype == "int64"
    if mode == "nan_loop":  # the report is at the last step (finite again) and names the first NaN's step and row
        text = report_text(report)
        assert report.step == cap.steps and f"step {NAN_STEP}" in text and "`conv1`" in text, text
        i = names.index("conv1")
        at_nan = diagnose(cap, step=NAN_STEP)  # flags are per step: the origin is flagged at its step
        assert "nan_origin_fwd" in at_nan.flags[i] and report.flags[i] == [], (at_nan.flags, report.flags)
    if mode == "shape_error":
        text = report_text(report)
        assert "`head`" in text and "512" in text and "800" in text, text


# -- feature maps -----------------------------------------------------------------------------
def check_featuremaps(res: Outcome, ctx: dict[str, Any]) -> None:
    mode, fm = ctx["mode"], res.result
    keys = list(fm.layers)
    _names_ok(keys)
    assert [lay["name"] for lay in shown(res).layers] == keys
    if mode == "shape_error":
        assert {"conv", "relu"} <= set(keys), keys
        return
    want = ["conv1", "bn", "relu"] if mode in RAISING else ["conv1", "bn", "relu", "conv2"] if mode == "interrupt_in_forward" else list(M.CNN_SPATIAL)
    assert set(want) <= set(keys), keys
    assert not {"conv2#2", "relu#3", "bn#2", "conv1#2"} & set(keys), f"recomputation rows: {keys}"
    assert shown(res).layer == want[-1], (res.widget.layer, want[-1])  # item 12: opens on an informative layer
    half = mode in {"fp16", "bf16", "autocast"}
    for name in want:  # every map equals the reference output at hook time (copies, not references)
        data, ref = fm.layers[name].data, ctx["acts"][name]
        assert close(data.float()[: ref.shape[0]], ref[: data.shape[0]], half), name


# -- Grad-CAM ---------------------------------------------------------------------------------
def hand_cam(W: torch.Tensor, act: torch.Tensor, classes: np.ndarray, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Grad-CAM at relu#2 by hand: pool is a mean over h·w, so d logit_c / dA = W_fc[c] / (h·w) (times
    the dropout mask's scale per channel, ``scale`` B×C, when dropout sits between pool and fc)."""
    A = act.float()
    hw = A.shape[-1] * A.shape[-2]
    cams = []
    for b in range(A.shape[0]):
        alpha = W[torch.as_tensor(classes[b])] / hw  # K×C
        if scale is not None:
            alpha = alpha * scale[b]
        cams.append(torch.relu(torch.einsum("kc,chw->khw", alpha, A[b])))
    return torch.stack(cams)


def cams_match(low: torch.Tensor, ref: torch.Tensor, half: bool) -> torch.Tensor:
    """Per (sample, class): the shown map has the hand map's shape (cosine) and is zero where it is."""
    cos = torch.nn.functional.cosine_similarity(low.flatten(2), ref.flatten(2), dim=-1, eps=1e-12)
    live = ref.flatten(2).amax(-1) > 0
    peak = float(low.abs().amax()) or 1.0
    dead_ok = low.flatten(2).abs().amax(-1) <= (1e-2 if half else 1e-5) * peak
    return torch.where(live, cos > (0.98 if half else 0.999), dead_ok)


def rerun_reference(ctx: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What Grad-CAM's re-run computes: the model as the cell left it (the reference model after the
    same cell) on the cell's first input, in its mode. Returns (relu#2's output B×C×H×W, its pooled
    B×C, fc's weight and bias)."""
    m = copy.deepcopy(ctx["ref"])
    got: dict[str, torch.Tensor] = {}
    h = m.relu.register_forward_hook(lambda _m, _a, out: got.__setitem__("relu#2" if "relu" in got else "relu", out.detach().clone()))
    h2 = m.pool.register_forward_hook(lambda _m, _a, out: got.__setitem__("pool", out.detach().flatten(1).float()))
    with torch.random.fork_rng(), torch.no_grad():
        m(ctx["inp"])
    h.remove()
    h2.remove()
    return got["relu#2"], got["pool"], m.fc.weight.detach().float(), m.fc.bias.detach().float()


def dropout_scales(model: torch.nn.Module, channels: int) -> list[torch.Tensor]:
    """Every per-channel scale a train-mode dropout between pool and fc can apply (0 or 1/(1-p)); one
    all-ones scale without one."""
    drop = model.drop
    if not (isinstance(drop, torch.nn.Dropout) and drop.training):
        return [torch.ones(channels)]
    keep = 1 / (1 - drop.p)
    return [torch.tensor([(i >> c & 1) * keep for c in range(channels)]) for i in range(2 ** channels)]


def check_rerun_cam(cam: Any, low: torch.Tensor, ctx: dict[str, Any], half: bool) -> None:
    """Cells whose model computes something else after the cell than in its first call (optimizer
    steps changed the weights; train-mode dropout draws new masks): the view explains its re-run,
    so each sample's classes, scores and maps equal the hand computation on the model as the cell
    left it, with one of the masks dropout can draw (the same for all three), and the view says that
    the scores differ from the cell's when they do."""
    A, pooled, W, bias = rerun_reference(ctx)
    tol = 2e-2 if half else 1e-4
    rerun = torch.empty(A.shape[0], W.shape[0])
    for b in range(A.shape[0]):
        fits = []
        for scale in dropout_scales(ctx["ref"], A.shape[1]):
            logit = W @ (pooled[b] * scale) + bias
            if not torch.equal(torch.as_tensor(cam.classes[b]), logit.argsort(descending=True)[: cam.classes.shape[1]]):
                continue
            if not np.allclose(cam.scores[b], logit[torch.as_tensor(cam.classes[b])].numpy(), rtol=tol, atol=tol):
                continue
            ok = cams_match(low[b : b + 1], hand_cam(W, A[b : b + 1], cam.classes[b : b + 1], scale[None]), half)
            if bool(ok.all()):
                fits.append(logit)
        assert fits, f"sample {b}: classes {cam.classes[b]}, scores {cam.scores[b]} and maps fit no re-run of the model as the cell left it"
        rerun[b] = fits[0]
    first = logits(ctx["ref_out"][0] if ctx["mode"] in LOOPS else ctx["ref_out"], False).detach().float()
    said = any("differ" in n for n in cam.notes)
    diff = float((first - rerun).abs().max())
    if diff > 1e-2 * (1 + float(first.abs().max())):
        assert said, f"the re-run's scores differ from the cell's by {diff:.3g} and no note says so: {cam.notes}"
    elif diff < 1e-6:
        assert not said, f"a note says the scores differ, they do not: {cam.notes}"


def check_gradcam(res: Outcome, ctx: dict[str, Any]) -> None:
    mode, cam = ctx["mode"], res.result
    half = ctx.get("half", mode in HALF)
    _names_ok(list(cam.layers))
    assert {"relu", "relu#2"} <= set(cam.layers) or mode == "shape_error", cam.layers
    assert cam.layer == "relu#2", cam.layer
    B, _, H, W = ctx["inp"].shape
    assert cam.cams.shape == (B, M.N_CLASSES, H, W), (cam.cams.shape, ctx["inp"].shape)
    low = torch.as_tensor(np.asarray(cam.maps["relu#2"].low, dtype=np.float32))
    if mode in ("dropout", "train_step"):  # the re-run sees other masks / trained weights than the first call
        check_rerun_cam(cam, low, ctx, half)
    else:
        first = ctx["ref_out"][0] if mode in LOOPS else ctx["ref_out"]
        ref_logits = logits(first, False).float()
        assert (cam.classes[:, 0] == ref_logits.argmax(1).numpy()).all(), (cam.classes[:, 0], ref_logits.argmax(1))
        ref = hand_cam(ctx["ref"].fc.weight.detach().float(), ctx["acts"]["relu#2"], cam.classes)
        ok = cams_match(low, ref, half)
        assert bool(ok.all()), ok
    w = shown(res)
    assert "relu#2" in w.layers and w.layer == cam.layer
    info, _ = w.handle_request("view", {"layer": "relu", "sample": 0})
    assert info["result"]["layer"] == "relu"


# -- attention --------------------------------------------------------------------------------
def reference_attention(ctx: dict[str, Any], ids: torch.Tensor) -> torch.Tensor:
    """(L, H, T, T) from output_attentions on an eager copy, under the same mode context."""
    m = copy.deepcopy(ctx["ref"])
    for mod in m.modules():  # the user's hooks (counters, raisers) are not part of the reference
        mod._forward_hooks.clear()
    m.set_attn_implementation("eager")
    mode = "plain" if ctx["mode"] in ("generate", "generate_user_hooks", "hf_ckpt") else ctx["mode"]
    if ctx["mode"] == "padded":
        real = ctx["inp"]["attention_mask"][1].nonzero().squeeze(1)
        with torch.no_grad():
            out = m(**ctx["inp"], output_attentions=True)
        return torch.stack([a[1][:, real][:, :, real] for a in out.attentions]).float()
    with torch.no_grad(), mode_context(mode):
        out = m(ids, output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]).float()


def generated_marks(result: Any) -> list[bool] | None:
    for obj in (result, getattr(result, "lens", None)):
        for name in ("generated", "is_generated", "generated_mask"):
            val = getattr(obj, name, None)
            if val is not None and len(val):
                return [bool(x) for x in np.asarray(val).tolist()]
    return None


def final_ids(ctx: dict[str, Any]) -> torch.Tensor:
    """The sequence the language views show: generated, the real tokens of item 1 (padded), or the prompt."""
    if ctx["mode"] == "padded":
        inp = ctx["inp"]
        return inp["input_ids"][1:2, inp["attention_mask"][1].bool()]
    return ctx["out"] if ctx["mode"].startswith("generate") else ctx["inp"]


def check_attention(res: Outcome, ctx: dict[str, Any]) -> None:
    att = res.result
    ids = final_ids(ctx)
    T = ids.shape[1]
    assert tuple(att.shape) == (2, 2, T), (att.shape, T)
    assert len(att.tokens) == T
    ref = reference_attention(ctx, ids)
    got = torch.stack([torch.stack([torch.as_tensor(np.asarray(att.head(i, h), dtype=np.float32)) for h in range(2)]) for i in range(2)])
    assert close(got, ref, ctx["mode"] in HALF), float((got - ref).abs().max()) if got.shape == ref.shape else got.shape
    assert shown(res).seq_len == T and res.widget.n_layers == 2
    if ctx["mode"].startswith("generate"):
        assert any("generate" in n for n in att.notes), f"the view does not say how generated tokens were covered: {att.notes}"
        assert generated_marks(att) == [False] * M.PROMPT_LEN + [True] * M.NEW_TOKENS, "generated tokens not marked"


# -- logit lens -------------------------------------------------------------------------------
def check_logitlens(res: Outcome, ctx: dict[str, Any]) -> None:
    lens = res.result
    shown(res)
    blocks = ["transformer.h.0", "transformer.h.1"] if ctx["family"] == "gpt2" else ["model.layers.0", "model.layers.1"]
    if ctx["mode"] in RAISING:  # the user's hook raised after block 1: what ran is embed and block 0
        assert list(lens.row_names)[:2] == ["embed", blocks[0]], lens.row_names
        return
    assert list(lens.row_names) == ["embed", *blocks], lens.row_names
    ids = final_ids(ctx)
    T = ids.shape[1]
    top1 = np.asarray(lens.top_ids)[-1, :, 0]
    # --max-bytes 0 keeps the residual stream of the last positions only: those are checked
    kept = min(len(top1), T) if ctx["mode"] == "budget0" else T
    assert kept >= 1 and top1.shape == (kept,), (top1.shape, T)
    if ctx["mode"].startswith("generate"):
        # greedy generation: the final row's top-1 at position t is the token generated at t+1
        gen = ids[0, M.PROMPT_LEN:].numpy()
        assert (top1[M.PROMPT_LEN - 1 : T - 1] == gen).all(), (top1, gen)
        assert any("generate" in n for n in lens.notes), f"the view does not say how generated tokens were covered: {lens.notes}"
        assert generated_marks(lens) == [False] * M.PROMPT_LEN + [True] * M.NEW_TOKENS, "generated tokens not marked"
        return
    if ctx["mode"] == "padded":
        real = ctx["inp"]["attention_mask"][1].bool()
        own = logits(ctx["out"], True)[1, real].float().argmax(-1).numpy()
    else:
        own = logits(ctx["out"], True)[0].float().argmax(-1).numpy()
    assert (top1 == own[T - kept :]).all(), (top1, own)
    assert "matches" in lens.check, lens.check


# -- --max-bytes 0 ----------------------------------------------------------------------------
BUDGET = re.compile(r"budget|max.bytes", re.I)


#: the views whose content is what the budget limits (nothing to show without it): the others must show
BUDGET_NOTE_OK = {"featuremaps"}


def check_budget(res: Outcome, ctx: dict[str, Any]) -> None:
    """``max_bytes=0`` is honoured (not replaced by the default) and the view says what it dropped
    (:func:`check` then checks what it shows as without a budget)."""
    if res.result is None:
        assert view_name(ctx["view"]) in BUDGET_NOTE_OK, f"view not shown: {res.note!r}"
        assert one_line(res.note) and BUDGET.search(res.note), f"not shown, and the note does not name the budget: {res.note!r}"
        return
    notes = list(getattr(res.result, "notes", []) or [])
    if ctx["view"] == "thermometer":
        from nbdebug.inspectors.thermometer import diagnose

        notes = diagnose(res.result).notes
        assert all(r.sample is None and r.histogram is None for r in res.result.layers), "values kept with max_bytes=0"
    assert any(BUDGET.search(n) for n in notes), f"no note says what the budget dropped: {notes}"
    assert all(one_line(n) for n in notes), notes


# -- a view that does not apply ------------------------------------------------------------------
WIDGET_CLASS = {"featuremaps": "FeatureMapsWidget", "gradcam": "GradCamWidget", "attention": "AttentionWidget", "logitlens": "LogitLensWidget"}


def check_not_applicable(res: Outcome, ctx: dict[str, Any]) -> None:
    v = view_name(ctx["view"])
    dbg = ctx["dbg"]
    assert res.result is None, f"{v} shown on a {ctx['family']}"
    assert one_line(res.note), f"no one-line note for {v}: {res.note!r}"
    note = dbg.note() if callable(getattr(dbg, "note", None)) else ""
    assert v in note and one_line(note), note
    assert list(dbg.results) == ["thermometer"], list(dbg.results)
    shown = dbg.widgets()
    assert [type(w).__name__ for w in shown] == ["ThermometerWidget"], shown
    # applies() is asked before any widget exists: no front-end model was created (and closed) for it
    assert widget_count(WIDGET_CLASS[v]) == ctx["widgets_before"].get(WIDGET_CLASS[v], 0), f"a {v} widget was created"
    dash = dbg.dashboard()
    assert any(v in n for n in dash.notes), dash.notes


def widget_count(cls_name: str | None = None) -> Any:
    """Live ipywidgets by class name (or the count of one class)."""
    from collections import Counter

    from ipywidgets.widgets.widget import _instances

    counts = Counter(type(w).__name__ for w in list(_instances.values()))
    return counts if cls_name is None else counts.get(cls_name, 0)
