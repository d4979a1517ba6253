"""The real-use matrix: how each mode runs a user's cell, and what each view must show afterwards.

A *cell* is one (mode, view) pair. :func:`run` builds a fresh tiny model, runs the user's code once
on an identical copy without nbdebug (the reference) and once under ``nbdebug.debug(model, view)``,
then checks: the view's content (exact names, values against the reference), hooks back to the
user's count, parameters/buffers/``.grad``/modes/attributes equal to the reference run's, the
attention implementation restored, and — when the mode leaves a graph — that the user's graph
still backpropagates to the same gradients. A view that cannot serve a mode must say so in one line
(``Debug.skipped``/``note()``), never raise.
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import nbdebug
from nbdebug.capture import fingerprint, hook_count, same_fingerprint

from . import models as M
from .usercode import (
    GRAPH_MODES,
    LANG,
    LOOPS,
    NAN_STEP,
    RAISING,
    Counter,
    Float64Watch,
    Outcome,
    Raiser,
    backward,
    build,
    close,
    family_of,
    logits,
    mode_context,
    raise_site,
    reference_activations,
    same_output,
    user_code,
    user_hook_sites,
    view_name,
)

__all__ = ["LOOPS", "NAN_STEP", "RAISING", "Outcome", "close", "family_of", "logits", "mode_context", "one_line", "run",
           "run_compiled", "run_del_model", "view_name"]


def options_for(mode: str, view: str) -> dict[str, Any]:
    if mode == "shared" and view == "gradcam":
        return {"gradcam_layer": "relu#2"}
    if mode == "budget0":
        return {"max_bytes": 0}
    if mode == "padded":
        return {"seq_index": 1}
    if mode in ("fp16", "bf16", "autocast"):  # histograms computed on the device too: float32, no float64
        return {"histograms": True}
    return {}


def debug_views(mode: str, view: str) -> str:
    return f"thermometer,{view_name(view)}" if mode == "not_applicable" else view_name(view)


def outcome_of(dbg: Any, view: str) -> Outcome:
    """The view's result and widget, or the one-line note it left instead (never an exception)."""
    v = view_name(view)
    if v == "all":  # checks.check_all looks at every view of the run
        dbg.widgets()
        return Outcome(view, result=dbg.results)
    widgets = dbg.widgets()
    results = dbg.results
    skipped = getattr(dbg, "skipped", {})
    if v in results and v not in skipped:
        shown = dict(zip(dbg.views, widgets)) if len(widgets) == len(dbg.views) else {}
        return Outcome(view, result=results[v], widget=shown.get(v))
    return Outcome(view, note=str(skipped.get(v, "")))


def one_line(note: str) -> bool:
    return bool(note) and "\n" not in note and "Traceback" not in note and len(note) <= 300


def attn_impl(model: nn.Module) -> str | None:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "_attn_implementation", None)


def close_all(dbg: Any) -> None:
    dash = getattr(dbg, "_dashboard", None)
    if dash is not None:
        dash.close()
    for w in dbg.widgets():
        w.close()


def run(mode: str, view: str, check: Callable[..., None]) -> Outcome:
    """Run one cell and apply ``check(outcome, ctx)``; returns the outcome (for the table)."""
    from .checks import widget_count

    family = family_of(mode, view)
    lm = family in LANG
    widgets_before = widget_count()
    model, inp = build(mode, family)
    user: dict[str, Any] = {}
    if mode in RAISING:
        user["raiser"] = Raiser(RAISING[mode])
        raise_site(model, family).register_forward_hook(user["raiser"])
    if mode in ("user_hooks", "generate_user_hooks"):
        user["counters"] = [Counter() for _ in user_hook_sites(model, family)]
        # and a full backward hook, as Captum or a Grad-CAM library would leave (conv2 / the last block)
        user["bwd"] = Counter()
        raise_site(model, family).register_full_backward_hook(user["bwd"])
        for site, c in zip(user_hook_sites(model, family), user["counters"]):
            site.register_forward_hook(c)
    ref = copy.deepcopy(model)
    expect_exc = RAISING.get(mode) or {"shape_error": RuntimeError, "dtype_error": RuntimeError, "interrupt_in_forward": KeyboardInterrupt}.get(mode)
    acts = reference_activations(model, lambda m: user_code(mode, family, m, inp), expect=expect_exc)
    # a loop: every forward's own (the thermometer keeps each step)
    acts_steps = [acts, *(reference_activations(model, lambda m: user_code(mode, family, m, inp), forward=k)
                          for k in range(2, LOOPS.get(mode, 1) + 1))]
    hooks_before = hook_count(model)
    impl_before = attn_impl(model)

    ref_inp = {k: v.clone() for k, v in inp.items()} if isinstance(inp, dict) else inp.detach().clone()
    if mode == "input_grad":  # a saliency-style cell: the user wants d(out)/d(x) in x.grad
        inp.requires_grad_(True)
        ref_inp.requires_grad_(True)
    torch.manual_seed(0)
    try:
        ref_out = user_code(mode, family, ref, ref_inp)
    except BaseException as exc:
        assert expect_exc is not None and isinstance(exc, expect_exc), exc
        ref_out = None
    else:
        assert expect_exc is None, f"test setup: the reference run did not raise the planted {expect_exc.__name__}"
    ref_rng = torch.get_rng_state()
    ref_counts = [h.calls for site in user_hook_sites(ref, family) for h in site._forward_hooks.values()
                  if isinstance(h, Counter)] if "counters" in user else []

    torch.manual_seed(0)
    dbg = nbdebug.debug(model, view=debug_views(mode, view), **options_for(mode, view))
    out = None
    if expect_exc is not None:
        raised: BaseException | None = None
        try:
            with dbg:
                out = user_code(mode, family, model, inp)
        except BaseException as exc:
            raised = exc
        assert raised is not None, "the user's exception did not propagate"
        if mode in RAISING:
            assert raised is user["raiser"].raised[-1], f"a different exception came out: {raised!r}"
        elif mode == "interrupt_in_forward":
            assert type(raised) is KeyboardInterrupt and str(raised) == "raised inside the model's forward", repr(raised)
        elif mode == "dtype_error":
            assert type(raised) is RuntimeError and "Half" in str(raised), raised
        else:
            assert type(raised) is RuntimeError and "mat1 and mat2" in str(raised), raised
    else:
        with Float64Watch(mode in ("fp16", "bf16", "autocast")) as f64, dbg:
            out = user_code(mode, family, model, inp)
        assert not f64.hits, f"float64 tensors created during a half-precision capture: {sorted(set(f64.hits))[:5]}"
    same_output(mode, out, ref_out, lm)
    res = outcome_of(dbg, view)
    ctx = dict(mode=mode, view=view, family=family, lm=lm, model=model, ref=ref, inp=inp, out=out,
               ref_out=ref_out, acts=acts, acts_steps=acts_steps, dbg=dbg, user=user, widgets_before=widgets_before)
    check(res, ctx)
    assert hook_count(model) == hooks_before, f"hooks {hooks_before} -> {hook_count(model)}"
    assert attn_impl(model) == impl_before, f"attention implementation {impl_before} -> {attn_impl(model)}"
    if "counters" in user:
        assert [c.calls for c in user["counters"]] == ref_counts, "the user's hooks were not called as without nbdebug"
    if mode == "pending_backward":
        if view_name(view) == "all":  # an on-demand fetch between the forward and the user's backward
            for v, w in zip(dbg.views, dbg.widgets()):
                fetch_more(Outcome(v, widget=w))
        else:
            fetch_more(res)
    assert torch.equal(torch.get_rng_state(), ref_rng), "nbdebug consumed random numbers: the user's next draws differ"
    if mode == "input_grad":
        assert inp.grad is None, "nbdebug wrote the input's .grad"
    if mode in GRAPH_MODES:
        backward(out, lm)
        backward(ref_out, lm)
    if "bwd" in user:
        ref_bwd = next(h for h in raise_site(ref, family)._backward_hooks.values() if isinstance(h, Counter))
        assert mode != "user_hooks" or ref_bwd.calls >= 1, "test setup: the backward hook never ran"
        assert user["bwd"].calls == ref_bwd.calls, f"the user's backward hook ran {user['bwd'].calls} times, {ref_bwd.calls} without nbdebug"
    if mode == "input_grad":
        assert inp.grad is not None and torch.equal(inp.grad, ref_inp.grad), "the input's gradient differs from a run without nbdebug"
    diffs = same_fingerprint(fingerprint(ref), fingerprint(model))
    assert diffs == [], f"model state differs from a run without nbdebug: {diffs}"
    close_all(dbg)
    return res


def fetch_more(res: Outcome) -> None:
    """Ask the widget for something it has not computed yet (another Grad-CAM layer, lens columns)."""
    w = res.widget
    assert w is not None, f"{res.view}: a result but no widget"
    v = view_name(res.view)
    if v == "gradcam":
        other = "relu" if w.layer != "relu" else "relu#2"
        w.handle_request("view", {"layer": other, "sample": 0})
    elif v == "logitlens":
        w.handle_request("columns", {"start": 0, "end": w.n_pos})
    elif v == "featuremaps":
        w.handle_request("page", {"layer": w.layer, "sample": 0})
    elif v == "attention":
        w.handle_request("head", {"layer": 0, "head": 0})
    elif v == "thermometer":
        w.handle_request("histogram", {"row": 0})


def run_del_model(view: str) -> tuple[bool, list[tuple[str, str]]]:
    """Build the views, drop everything but the results and widgets (what the magic keeps), ``del
    model``; is it gone? ``view`` may be ``all[family]`` (the dashboard's views).

    Returns (model collected, (view, answer) of on-demand fetches: "ok" when the answer equals the same
    fetch's answer on a twin — the same cell on a deep copy of the model, which stays alive — content
    and buffers; else the error text sent back, or "differs: …" when an ``ok`` answer is not the twin's).
    """
    import weakref

    family = family_of("del_model", view)
    model, inp = build("del_model", family)
    twin, twin_inp = copy.deepcopy(model), copy.deepcopy(inp)  # the same cell on a model that stays alive
    dbg, widgets, dash = shown_views(model, inp, view, family)
    results = dbg.results
    twin_dbg, twin_widgets, twin_dash = shown_views(twin, twin_inp, view, family)
    wr = weakref.ref(model)
    del model, dbg
    gc.collect()
    gone = wr() is None
    answers: list[tuple[str, str]] = []
    for v, w in widgets.items():
        for method, params in fetches(v, w):
            answers.append((v, judge(ask(twin_widgets[v], method, params), ask(w, method, params))))
        w.close()
        twin_widgets[v].close()
    for d in (dash, twin_dash):
        if d is not None:
            d.close()
    del results, twin_dbg
    return gone, answers


def shown_views(model: nn.Module, inp: Any, view: str, family: str) -> tuple[Any, dict[str, Any], Any]:
    """The del_model cell on ``model``: (debug session, view → widget, dashboard or None)."""
    dbg = nbdebug.debug(model, view=view_name(view))
    with dbg:
        user_code("del_model", family, model, inp)
    widgets = dict(zip(dbg.views, dbg.widgets()))
    dash = dbg.dashboard() if view_name(view) == "all" else None
    assert view_name(view) == "all" or view_name(view) in widgets, f"view not shown: {dbg.skipped}"
    return dbg, widgets, dash


def ask(w: Any, method: str, params: dict[str, Any]) -> tuple[dict[str, Any], list[Any]] | None:
    """What the browser would receive for one request: (content, buffers), or None (no answer)."""
    sent: list[tuple[dict[str, Any], list[Any]]] = []
    w.send = lambda content, buffers=None: sent.append((content, list(buffers or [])))
    w._handle_request(w, {"type": "request", "id": 1, "method": method, "params": params}, [])
    return sent[0] if sent else None


def same_answer(a: Any, b: Any) -> bool:
    """Equal JSON-like contents (dicts, lists, numbers, strings, arrays, buffers), NaN equal to NaN."""
    import numpy as np

    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(same_answer(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same_answer, a, b))
    if isinstance(a, (bytes, bytearray, memoryview)) or isinstance(b, (bytes, bytearray, memoryview)):
        return bytes(a) == bytes(b)
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=np.asarray(a).dtype.kind == "f"))
    return bool(a == b)


def judge(before: Any, after: Any) -> str:
    """``"ok"`` when ``after`` is an ``ok`` answer equal to ``before`` (the same fetch, the model alive)."""
    if after is None:
        return "no answer"
    content, buffers = after
    if not content.get("ok"):
        return str(content.get("error"))
    if before is None or not before[0].get("ok"):
        return f"differs: answered after del model, not with the model alive ({before})"
    if not same_answer({k: v for k, v in content.items() if k != "id"}, {k: v for k, v in before[0].items() if k != "id"}) \
            or not same_answer(buffers, before[1]):
        return f"differs: the answer after del model is not the one with the model alive ({str(content)[:200]})"
    return "ok"


def fetches(v: str, w: Any) -> list[tuple[str, dict[str, Any]]]:
    if v == "gradcam":
        return [("view", {"layer": "relu" if w.layer != "relu" else "relu#2", "sample": 0})]
    if v == "logitlens":
        return [("columns", {"start": 0, "end": w.n_pos}), ("cell", {"row": 0, "pos": 0})]
    if v == "featuremaps":
        return [("page", {"layer": w.layer, "sample": 0})]
    if v == "attention":
        return [("head", {"layer": 0, "head": 0})]
    return [("histogram", {"row": 0})]


def run_compiled(view: str, compiled: nn.Module, orig: nn.Module, check: Callable[..., None]) -> Outcome:
    """A ``torch.compile``d eval-mode model (compiled once per session): the view works or says so in one line."""
    from .checks import widget_count

    family = family_of("compiled", view)
    lm = family in LANG
    inp = M.image() if family == "cnn" else M.prompt()
    widgets_before = widget_count()
    ref = copy.deepcopy(orig)
    acts = reference_activations(orig, lambda m: m(inp))
    with torch.no_grad():
        ref_out = ref(inp)
    before = fingerprint(orig)
    dbg = nbdebug.debug(compiled, view=view_name(view))
    with dbg:
        out = compiled(inp)
    assert torch.allclose(logits(out, lm), logits(ref_out, lm), atol=1e-5), "the compiled cell's output changed"
    res = outcome_of(dbg, view)
    ctx = dict(mode="compiled", view=view, family=family, lm=lm, model=compiled, ref=ref, inp=inp, out=out,
               ref_out=ref_out, acts=acts, dbg=dbg, user={}, widgets_before=widgets_before)
    check(res, ctx)
    diffs = same_fingerprint(before, fingerprint(orig))
    assert diffs == [], f"model state changed: {diffs}"
    assert hook_count(compiled) == before["hooks"]
    close_all(dbg)
    return res
