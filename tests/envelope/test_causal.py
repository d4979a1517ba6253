"""The real-use matrix's rows for the causal workbench (issue 20) and attribution (issue 21).

Columns (``causal.py``): ``patch`` (``nbdebug.patch`` exact and attribution), ``ablate``, ``steer``
(also around ``generate()``), ``patching`` (``--view patching``), ``attribution`` (``nbdebug.attribute``
and ``--view attribution``), ``cams`` (``--view gradcam --method all --faithfulness --sanity``).
Each cell runs on a fresh tiny model (GPT-2, the TinyCNN; Llama when offloaded) and checks its
content — the plain mode against plain hooks / a hand gradient, every other mode against the plain
mode's result — and the hygiene: no hook left, parameters/buffers/``.grad``/modes/RNG as found, the
user's graph backpropagating to the same gradients. A view that cannot serve a mode leaves a one-line
note (never a traceback).
"""

from __future__ import annotations

import copy
import gc
import weakref
from typing import Any

import pytest
import torch

import nbdebug
from nbdebug.capture.weak import MODEL_GONE

from . import cams_ref
from . import causal as C
from . import models as M
from .cells import ask, judge, one_line

pytest.importorskip("transformers")

API = ["patch", "patch[attribution]", "ablate", "steer", "steer[generate]", "attribution[api]"]
VIEWS = ["patching", "attribution", "cams"]
API_MODES = ["plain", "no_grad", "inference_mode", "bf16", "pending_backward", "interrupt_mid", "exception_mid", "del_model"]
VIEW_MODES = ["plain", "no_grad", "inference_mode", "bf16", "pending_backward", "keyboard_interrupt", "exception", "del_model"]
#: tolerance of a bf16 result against the same hand reference run in bf16 (× the content's scale):
#: token ids exactly; logits and metrics to 1e-2 (ablate, steer, patch: the same bf16 ops in the same order as
#: the hand hooks, equal today; attribution's float32 reference on a copy: 0.4 % off)
BF16_TOL = {"patch": 1e-2, "patch[attribution]": 1e-2, "patching": 1e-2, "attribution[api]": 1e-2, "attribution": 1e-2,
            "cams": 0.1, "ablate": 1e-2, "steer": 1e-2, "steer[generate]": 0.0}


def model_for(op: str, mode: str) -> torch.nn.Module:
    m = M.tiny_cnn().eval() if op == "cams" else M.tiny_lm("gpt2")
    return m.to(torch.bfloat16) if mode == "bf16" else m


def key(mode: str, op: str) -> tuple[str, str]:
    """The Works-with cell: ``steer[generate]`` in the plain mode is the ``generate()`` row."""
    return ("generate", "steer") if (mode, op) == ("plain", "steer[generate]") else (mode, op)


_PLAIN: dict[str, dict[str, Any]] = {}


def plain(op: str) -> dict[str, Any]:
    """The plain mode's content of ``op`` (computed once)."""
    if op not in _PLAIN:
        m = model_for(op, "plain")
        _PLAIN[op] = C.run_api(op, m, "plain") if op in API else view_run(op, m, "plain")[0]
    return _PLAIN[op]


def view_run(op: str, model: torch.nn.Module, mode: str, raise_: BaseException | None = None) -> tuple[dict[str, Any] | None, str, Any]:
    """``%%nndebug model --view <op>`` around ``out = model(x)`` in ``mode``: (content or None, note, widget)."""
    x = C.view_input(op, model)
    dbg = nbdebug.debug(model, view=C.VIEW_OPS[op], **C.view_options(op, model))
    try:
        with dbg:
            with C.mode_context(mode):
                model(x)
                if raise_ is not None:
                    raise raise_
    except (C.Stop, KeyboardInterrupt):
        assert raise_ is not None
    v = C.VIEW_OPS[op]
    if v in dbg.results and v not in dbg.skipped:
        return C.view_content(op, dbg.results[v]), "", dbg.widget()
    return None, str(dbg.skipped.get(v, "")), None


@pytest.mark.parametrize(("mode", "op"), [(m, o) for m in API_MODES for o in API])
def test_api(mode: str, op: str, record_property: Any) -> None:
    record_property("cell", key(mode, op))
    model = model_for(op, mode)
    if mode == "del_model":
        C.run_api(op, model, "plain")
        wr = weakref.ref(model)
        del model
        gc.collect()
        assert wr() is None, "nbdebug keeps the model after the operation"
        return
    out = None
    if mode == "pending_backward":  # the user's graph, backpropagated after the operation
        ref = copy.deepcopy(model)
        out = model(C.prompts()[0]).logits
    before = C.Snapshot(model)
    if mode in ("interrupt_mid", "exception_mid"):
        raise_mid(op, model, KeyboardInterrupt if mode == "interrupt_mid" else C.Stop)
    else:
        got = C.run_api(op, model, mode)
        if mode == "bf16":
            C.equal(got, C.reference(op, model), BF16_TOL[op])
        elif mode == "plain":
            C.equal(got, C.reference(op, model) or plain(op), 1e-5)
        else:
            C.equal(got, plain(op), 1e-5)
    before.same(model)
    if out is not None:
        out.float().pow(2).mean().backward()
        ref(C.prompts()[0]).logits.float().pow(2).mean().backward()
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad)), n


def raise_mid(op: str, model: torch.nn.Module, exc: type[BaseException]) -> None:
    """``op`` stopped by ``exc`` in its middle: the grid's progress callback, the metric, the user's
    code inside ``ablate``/``steer``, or the user's hook mid-``generate()``."""
    calls = {"n": 0}

    def progress(done: int, total: int) -> None:
        raise exc("mid-grid")

    def metric(logits: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] >= 2:
            raise exc("mid-attribution")
        return logits[:, -1, C.ANSWER] - logits[:, -1, C.WRONG]

    def stop(*_a: Any) -> None:  # the user's own hook stops generate() mid-way (third forward)
        calls["n"] += 1
        if calls["n"] == 3:
            raise exc("mid-generate")

    with pytest.raises(exc):
        if op == "patch":
            C.run_api(op, model, "plain", progress=progress)
        elif op in ("patch[attribution]", "attribution[api]"):
            C.run_api(op, model, "plain", metric=metric)
        elif op == "steer[generate]":
            h = C.blocks(model)[-1].register_forward_hook(stop)
            try:
                C.run_api(op, model, "plain")
            finally:
                h.remove()
        else:
            cm = nbdebug.ablate(model, heads={0: [1]}) if op == "ablate" else nbdebug.steer(model, layer=0, vector=C.steer_vector(model), alpha=C.ALPHA)
            with cm:
                model(C.prompts()[0])
                raise exc("in the user's code")


@pytest.mark.parametrize(("mode", "op"), [(m, o) for m in VIEW_MODES for o in VIEWS])
def test_view(mode: str, op: str, record_property: Any) -> None:
    record_property("cell", (mode, op))
    model = model_for(op, mode)
    if mode == "del_model":  # an answer after del model: the twin's (the same cell, its model alive) or "gone"
        twin = copy.deepcopy(model)
        content, note, w = view_run(op, model, "plain")
        assert content is not None, note
        twin_w = view_run(op, twin, "plain")[2]
        wr = weakref.ref(model)
        del model
        gc.collect()
        assert wr() is None, "the widget keeps the model"
        method, params = {"patching": ("grid", {"sites": "attn"}), "attribution": ("attribution", {"method": "occlusion"}),
                          "cams": ("view", {"layer": "relu", "sample": 0})}[op]
        answer = judge(ask(twin_w, method, params), ask(w, method, params))
        assert answer == "ok" or MODEL_GONE in answer, answer
        w.close()
        twin_w.close()
        return
    out = None
    if mode == "pending_backward":
        ref = copy.deepcopy(model)
    before = C.Snapshot(model)
    raise_ = {"keyboard_interrupt": KeyboardInterrupt("mid-cell"), "exception": C.Stop("mid-cell")}.get(mode)
    if mode == "pending_backward":
        x = C.view_input(op, model)
        with nbdebug.debug(model, view=C.VIEW_OPS[op], **C.view_options(op, model)) as dbg:
            out = model(x)
        res = dbg.results[C.VIEW_OPS[op]]
        content, note = C.view_content(op, res), ""
        dbg.widget().close()
    else:
        content, note, w = view_run(op, model, mode, raise_)
        if w is not None:
            w.close()
    if content is None:
        assert one_line(note), f"not a one-line note: {note!r}"
        record_property("note", note)
    elif mode == "bf16":
        C.equal(content, C.reference(op, model) or plain(op), BF16_TOL[op])
    elif mode == "plain" and op == "cams":  # every method's map, faithfulness and sanity by hand
        cams_ref.equal(content, cams_ref.content(model), 1e-5)
    elif mode == "plain":
        C.equal(content, C.reference(op, model), 1e-5)
    else:
        C.equal(content, plain(op), 1e-5)
    before.same(model)
    if out is not None:
        lg(out).float().pow(2).mean().backward()
        lg(ref(C.view_input(op, ref))).float().pow(2).mean().backward()
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.allclose(p.grad, q.grad, atol=1e-6)), n


def lg(out: Any) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.logits


@pytest.mark.parametrize("op", ["patch", "patch[attribution]", "ablate", "steer", "steer[generate]", "attribution[api]", "patching", "attribution"])
def test_offloaded(op: str, offloaded: Any, record_property: Any) -> None:
    """On an accelerate-offloaded Llama (CPU + disk ``device_map``): equal to the same on the model in memory (1e-4)."""
    from .offload import accelerate_state, same_state

    record_property("cell", ("offloaded_generate" if op == "steer[generate]" else "offloaded", op))
    m, ref = offloaded
    state = accelerate_state(m)
    before = C.Snapshot(m)
    if op in VIEWS:
        got, note, w = view_run(op, m, "no_grad")
        want = view_run(op, ref, "no_grad")[0]
        assert got is not None, note
        w.close()
    else:
        got, want = C.run_api(op, m, "no_grad"), C.run_api(op, ref, "no_grad")
    C.equal(got, want, 1e-4)
    before.same(m)
    same_state(state, accelerate_state(m))


def embeds_cell(model: torch.nn.Module) -> None:
    model(inputs_embeds=model.get_input_embeddings()(C.prompts()[0]).detach())


@pytest.mark.parametrize(("mode", "op"), [("not_applicable", "attribution"), ("not_applicable", "cams"),
                                          ("inputs_embeds", "attribution"), ("inputs_embeds", "patching")])
def test_view_does_not_apply(mode: str, op: str, record_property: Any) -> None:
    """A model or a call the view cannot serve (a CNN for attribution, a language model for the CAMs,
    no token ids): a one-line note, nothing left on the model."""
    record_property("cell", (mode, op))
    model = M.tiny_cnn().eval() if (mode, op) == ("not_applicable", "attribution") else M.tiny_lm("gpt2")
    before = C.Snapshot(model)
    opts = C.view_options(op, model) if hasattr(model, "config") or op != "attribution" else {"answer": C.ANSWER}
    with nbdebug.debug(model, view=C.VIEW_OPS[op], **opts) as dbg:
        if mode == "inputs_embeds":
            embeds_cell(model)
        else:
            model(M.image() if op == "attribution" else C.prompts()[0])
    results = dbg.results  # settles the views (a view that does not apply is skipped then)
    note = str(dbg.skipped.get(C.VIEW_OPS[op], ""))
    assert C.VIEW_OPS[op] not in results and one_line(note), (results, note)
    record_property("note", note)
    before.same(model)


@pytest.mark.parametrize("op", ["patching", "attribution"])
def test_view_over_generate(op: str, record_property: Any) -> None:
    """A cell that calls ``generate()``: the view's clean run / prompt is the prompt (equal to the plain
    hooks / hand gradient); attribution offers the generated tokens, and picking the k-th equals
    ``nbdebug.attribute`` on the prompt and the k tokens before it with that token as the answer."""
    record_property("cell", ("generate", op))
    model = M.tiny_lm("gpt2")
    before = C.Snapshot(model)
    x = C.prompts()[0]
    with nbdebug.debug(model, view=op, **C.view_options(op, model)) as dbg:
        seq = model.generate(x, max_new_tokens=M.NEW_TOKENS, do_sample=False, pad_token_id=0)
    res = dbg.results[op]
    C.equal(C.view_content(op, res), C.reference(op, model), 1e-5)
    if op == "attribution":
        w = dbg.widget()
        assert len(w.generated) == M.NEW_TOKENS
        content, _ = w.handle_request("attribution", {"method": "grad_x_input", "pick": 2})
        n = x.shape[1] + 2
        ref = nbdebug.attribute(model, seq[:, :n], answer=int(seq[0, n]), wrong=C.WRONG)
        C.equal({"scores": content["result"]["scores"]}, {"scores": ref.scores}, 1e-6)
        w.close()
    before.same(model)
