"""`%%nndebug model --view attention`: a clicked head → ablate (zero | mean) → Δ metric, top-5, lens diff.

Through a fresh ``InteractiveShell`` on tiny random GPT-2 and Llama (GQA) models: the ``ablate``
request's Δ and top-5 equal a hand-hooked forward that zeroes (or replaces by its mean over positions)
the head's slice of the attention output projection's input (``c_proj`` / ``o_proj``); two heads at
once; with ``--answer/--wrong`` the metric is the logit difference; no hook is left and the parameters
are unchanged after clicks, also for ``no_grad``/``inference_mode`` cells; ``del model`` answers with
"re-run the cell"; an encoder without a language-model head says so in one line.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest
import torch

from nbdebug.capture import fingerprint, hook_count, same_fingerprint

HEADS, D = 4, 32


def setup(family: str) -> str:
    return f"""
import torch
from nbdebug.adapters.offline import tiny_lm
model = tiny_lm({family!r}, layers=3, heads={HEADS}, d={D})
x = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(1))
"""


def run(shell: Any, family: str, body: str = "out = model(x)", extra: str = "") -> Any:
    assert shell.run_cell(setup(family)).success
    res = shell.run_cell(f"%%nndebug model --view attention {extra}\n{body}")
    assert res.success, res.error_in_exec
    return shell.user_ns["_nndebug_widget"]


def out_proj(model: torch.nn.Module, layer: int) -> torch.nn.Module:
    """The attention output projection whose input holds the heads' outputs side by side."""
    if hasattr(model, "transformer"):
        return model.transformer.h[layer].attn.c_proj
    return model.model.layers[layer].self_attn.o_proj


def hand_logits(model: torch.nn.Module, ids: torch.Tensor, heads: dict[int, list[int]], mode: str) -> torch.Tensor:
    """The last position's logits with ``heads`` zeroed (or set to their mean over positions), plain hooks."""
    dh = D // HEADS

    def pre(hs: list[int]) -> Any:
        def hook(_m: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
            z = args[0].clone()
            for h in hs:
                sl = z[..., h * dh:(h + 1) * dh]
                z[..., h * dh:(h + 1) * dh] = 0 if mode == "zero" else sl.mean(dim=(0, 1), keepdim=True)
            return (z, *args[1:])
        return hook

    handles = [out_proj(model, layer).register_forward_pre_hook(pre(hs)) for layer, hs in heads.items()]
    try:
        with torch.no_grad():
            out = model(ids)
    finally:
        for h in handles:
            h.remove()
    return out.logits[0, -1].double()


def clean_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits[0, -1].double()


def heads_request(heads: list[list[int]], mode: str | None = "zero") -> dict[str, Any]:
    """The one ablation request (nbdebug.sessions.ablation_io) for ``[[layer, head], ...]``."""
    req: dict[str, Any] = {"kind": "heads", "targets": [{"layer": layer, "units": [h]} for layer, h in heads]}
    return req if mode is None else {**req, "mode": mode}


def ask(w: Any, heads: list[list[int]], mode: str = "zero") -> dict[str, Any]:
    content, _ = w.handle_request("ablate", heads_request(heads, mode))
    return content["result"]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablate_equals_a_hand_hooked_forward(shell, family: str, mode: str) -> None:  # type: ignore[no-untyped-def]
    w = run(shell, family)
    model, x = shell.user_ns["model"], shell.user_ns["x"]
    assert w.ablate_note == ""
    clean = clean_logits(model, x)
    top1 = int(clean.argmax())
    for heads in ({1: [2]}, {0: [1], 2: [3]}):  # one head, then two heads in two layers together
        got = ask(w, [[layer, h] for layer, hs in heads.items() for h in hs], mode)
        want = hand_logits(model, x, heads, mode)
        p_clean, p_abl = torch.softmax(clean, -1), torch.softmax(want, -1)
        assert got["metric"]["delta"] == pytest.approx(float(p_abl[top1] - p_clean[top1]), rel=1e-4, abs=1e-7)
        assert got["metric"]["clean"] == pytest.approx(float(p_clean[top1]), rel=1e-5)
        assert [t["id"] for t in got["top"]["ablated"]] == [int(i) for i in p_abl.topk(5).indices]
        np.testing.assert_allclose([t["p"] for t in got["top"]["ablated"]], p_abl.topk(5).values.numpy(), rtol=1e-4)
        assert [t["id"] for t in got["top"]["clean"]] == [int(i) for i in p_clean.topk(5).indices]
        lens = got["lens"]  # two lens columns: {row, id, token, p, p_answer} per row
        rows = [e["row"] for e in lens["clean"]]
        assert len(rows) == 3 + 1 and rows[0] == "embed" and rows[-1] == "output"
        clean_p, ablated_p = ([e["p_answer"] for e in lens[run]] for run in ("clean", "ablated"))
        assert ablated_p[-1] == pytest.approx(float(p_abl[top1]), rel=1e-4)
        first = min(heads)  # blocks before the first ablated one read the same residual
        assert clean_p[: first + 1] == pytest.approx(ablated_p[: first + 1], rel=1e-6)
        assert w.ablated == sorted([layer, h] for layer, hs in heads.items() for h in hs)
    assert w.ablate_clicks == 2


def test_the_lens_rows_are_the_logit_lens_of_each_block_input(shell) -> None:  # type: ignore[no-untyped-def]
    w = run(shell, "llama")
    model, x = shell.user_ns["model"], shell.user_ns["x"]
    got = ask(w, [[1, 0]])
    seen: list[torch.Tensor] = []
    hooks = [b.register_forward_pre_hook(lambda m, a, kw: seen.append(a[0] if a else kw["hidden_states"]), with_kwargs=True)
             for b in model.model.layers]
    try:
        top1 = int(clean_logits(model, x).argmax())
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad():
        for j, h in enumerate(seen):
            p = torch.softmax(model.lm_head(model.model.norm(h[0, -1])).double(), -1)
            assert got["lens"]["clean"][j]["p_answer"] == pytest.approx(float(p[top1]), rel=1e-4)


@pytest.mark.parametrize("body", ["out = model(x)", "with torch.no_grad():\n    out = model(x)",
                                  "with torch.inference_mode():\n    out = model(x)"])
def test_answer_wrong_metric_and_the_model_left_as_found(shell, body: str) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(setup("llama")).success
    model, x = shell.user_ns["model"], shell.user_ns["x"]
    before = fingerprint(model)
    res = shell.run_cell(f"%%nndebug model --view attention --answer 3 --wrong #4\n{body}")
    assert res.success, res.error_in_exec
    w = shell.user_ns["_nndebug_widget"]
    for mode in ("zero", "mean"):
        got = ask(w, [[2, 1], [2, 3]], mode)
        want, clean = hand_logits(model, x, {2: [1, 3]}, mode), clean_logits(model, x)
        assert got["metric"]["label"].startswith("logit[")
        assert got["metric"]["delta"] == pytest.approx(float((want[3] - want[4]) - (clean[3] - clean[4])), rel=1e-4, abs=1e-6)
        assert got["metric"]["of"]["label"] == "3"
    assert hook_count(model) == 0 and same_fingerprint(before, fingerprint(model)) == []
    assert all(p.grad is None for p in model.parameters())


def test_a_deleted_model_answers_rerun_the_cell(shell) -> None:  # type: ignore[no-untyped-def]
    w = run(shell, "gpt2")
    ask(w, [[0, 0]])
    assert shell.run_cell("import weakref\nref = weakref.ref(model)\ndel model\nout = None").success
    gc.collect()
    assert shell.user_ns["ref"]() is None
    with pytest.raises(Exception, match="re-run the cell"):
        w.handle_request("ablate", heads_request([[0, 0]]))


def test_an_encoder_says_in_one_neutral_line_that_it_cannot_ablate(shell) -> None:  # type: ignore[no-untyped-def]
    """Not a stacked "ablation needs …: … patching needs a causal language model" (this view has no
    patching): one sentence about this view."""
    w = run(shell, "bert")
    name = type(shell.user_ns["model"]).__name__
    assert w.ablate_note == (f"Heads are not ablated in this view: {name} is an encoder, with no next-token output "
                             "to measure a head's effect on.")
    assert "patching" not in w.ablate_note and "causal" not in w.ablate_note
    with pytest.raises(RuntimeError, match="Heads are not ablated in this view"):
        w.handle_request("ablate", heads_request([[0, 0]], None))


def test_bad_requests_are_errors(shell) -> None:  # type: ignore[no-untyped-def]
    w = run(shell, "gpt2")
    with pytest.raises(IndexError, match="no head"):
        w.handle_request("ablate", heads_request([[9, 0]], None))
    with pytest.raises(ValueError, match="no head to ablate"):
        w.handle_request("ablate", heads_request([], None))
    with pytest.raises(ValueError, match="mode="):
        w.handle_request("ablate", heads_request([[0, 0]], "resample"))
