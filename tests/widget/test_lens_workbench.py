"""Issue 20 in the lens views: steering in ``--view logitlens --steer VAR`` and the patched run's
logit-lens column in ``--view patching``.

Through a fresh ``InteractiveShell`` on tiny random GPT-2 / Llama models: the steered lens equals a
hand-hooked forward adding ``alpha · v`` to the block's output, read through the model's final norm
and unembedding in the test; ``alpha`` 0 is the original lens; the patched lens column equals a hand
forward with the patch (plain hooks) through final norm + unembedding; the clean and corrupt columns
equal plain forwards; no hook is left, the model is unchanged, the cell may run under
``inference_mode``; after ``del model`` a new request says to re-run the cell.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest
import torch
from IPython.core.error import UsageError

from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.widgets._transport import decode_array

ANSWER, WRONG = 3, 4


def setup(family: str) -> str:
    return f"""
import torch, nbdebug
from nbdebug.adapters.offline import tiny_lm
model = tiny_lm({family!r}, layers=3, heads=4, d=32)
x = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(1))
x2 = x.clone(); x2[0, 2] = (x2[0, 2] + 7) % 64; x2[0, 4] = (x2[0, 4] + 11) % 64
v = torch.randn(32, generator=torch.Generator().manual_seed(2))
"""


def head_of(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module, list[torch.nn.Module]]:
    """(final norm, lm_head, blocks) of the tiny HF model, named by hand (not through nbdebug)."""
    if hasattr(model, "transformer"):
        return model.transformer.ln_f, model.lm_head, list(model.transformer.h)
    return model.model.norm, model.lm_head, list(model.model.layers)


def lens_probs(model: torch.nn.Module, residual: torch.Tensor) -> torch.Tensor:
    """softmax(lm_head(norm(residual))) in float64."""
    norm, head, _ = head_of(model)
    with torch.no_grad():
        return torch.softmax(head(norm(residual)).double(), -1)


def hand_residuals(model: torch.nn.Module, ids: torch.Tensor, edits: dict[int, Any] | None = None) -> list[torch.Tensor]:
    """The first block's input and every block's output ``(T, d)`` of a plain forward; ``edits``: block
    index → ``fn(output tensor) -> new tensor`` applied as a forward hook."""
    _, _, blocks = head_of(model)
    seen: list[torch.Tensor] = []
    handles = [blocks[0].register_forward_pre_hook(
        lambda m, a, kw: seen.append((a[0] if a else kw["hidden_states"]).detach().clone()), with_kwargs=True)]

    def post(i: int) -> Any:
        def fn(m: Any, a: Any, out: Any) -> Any:
            x = out[0] if isinstance(out, tuple) else out
            if edits and i in edits:
                x = edits[i](x)
                out = (x, *out[1:]) if isinstance(out, tuple) else x
            seen.append(x.detach().clone())
            return out
        return fn

    handles += [b.register_forward_hook(post(i)) for i, b in enumerate(blocks)]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in handles:
            h.remove()
    return [s[0] for s in seen]


def arrays(content: dict[str, Any], buffers: list[Any]) -> dict[str, np.ndarray]:
    return {name: decode_array({"view": buffers[m["buffer"]], "dtype": m["dtype"], "shape": m["shape"]})
            for name, m in content["arrays"].items()}


def check_lens(got: dict[str, np.ndarray], positions: list[int], model: torch.nn.Module, resid: list[torch.Tensor]) -> None:
    """Every row × position's top-1 id and probability equal softmax(head(norm(residual)))."""
    for r, h in enumerate(resid):
        p = lens_probs(model, h)  # (T, V)
        for j, pos in enumerate(positions):
            top = p[pos].topk(3)
            assert int(got["top_ids"][r, j, 0]) == int(top.indices[0]), (r, pos)
            np.testing.assert_allclose(got["top_probs"][r, j, :3], top.values.numpy(), rtol=1e-4, atol=1e-6)


# -- steering in the lens view ---------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_steered_lens_equals_a_hand_hooked_forward_and_alpha_0_is_the_original(shell, family: str) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(setup(family)).success
    model = shell.user_ns["model"]
    before = fingerprint(model)
    res = shell.run_cell("%%nndebug model --view logitlens --steer v\nwith torch.inference_mode():\n    out = model(x)")
    assert res.success, res.error_in_exec
    w = shell.user_ns["_nndebug_widget"]
    _, _, blocks = head_of(model)
    names = {id(m): n for n, m in model.named_modules()}
    assert w.steer_layers == [names[id(b)] for b in blocks] and w.steer_layer == w.steer_layers[1]  # the middle block
    assert w.steer_hint == ""
    x, v = shell.user_ns["x"], shell.user_ns["v"]
    for layer, alpha in ((1, 4.0), (0, -6.5)):
        content, buffers = w.handle_request("steer", {"layer": w.steer_layers[layer], "alpha": alpha, "start": 0, "end": 7})
        got = content["result"]
        assert got["positions"] == list(range(7)) and got["alpha"] == alpha
        want = hand_residuals(model, x, {layer: lambda h, a=alpha: h + a * v})
        check_lens(arrays(content, buffers), got["positions"], model, want)
        steered_next = lens_probs(model, want[-1][-1]).topk(5)
        assert [t["id"] for t in got["top"]["steered"]] == [int(i) for i in steered_next.indices]
        np.testing.assert_allclose([t["p"] for t in got["top"]["steered"]], steered_next.values.numpy(), rtol=1e-4)
        plain_next = lens_probs(model, hand_residuals(model, x)[-1][-1]).topk(5)
        assert [t["id"] for t in got["top"]["original"]] == [int(i) for i in plain_next.indices]
        assert got["top"]["steered"] != got["top"]["original"]  # the vector moved the distribution
    assert w.steer_runs == 2
    content, buffers = w.handle_request("steer", {"layer": w.steer_layers[1], "alpha": 0.0, "start": 0, "end": 7})
    check_lens(arrays(content, buffers), list(range(7)), model, hand_residuals(model, x))
    assert content["result"]["top"]["steered"] == content["result"]["top"]["original"] and w.steer_runs == 2  # no run
    w.handle_request("steer", {"layer": w.steer_layers[1], "alpha": 4.0})
    assert w.steer_runs == 2  # a setting seen before is cached
    assert hook_count(model) == 0 and same_fingerprint(before, fingerprint(model)) == []


def test_a_dict_of_vectors_offers_its_layers_and_the_vectors_layer_is_the_default(shell) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(setup("llama") + "\nvs = {2: v, 'model.layers.0': -v}\nv.layer = 'model.layers.2'").success
    assert shell.run_cell("%%nndebug model --view logitlens --steer vs\nout = model(x)").success
    w = shell.user_ns["_nndebug_widget"]
    assert w.steer_layers == ["model.layers.2", "model.layers.0"] and w.steer_layer == "model.layers.2"
    with pytest.raises(ValueError, match="no steering vector"):
        w.handle_request("steer", {"layer": "model.layers.1", "alpha": 1.0})
    assert shell.run_cell("%%nndebug model --view logitlens --steer v\nout = model(x)").success
    assert shell.user_ns["_nndebug_widget"].steer_layer == "model.layers.2"  # the vector's own layer


def test_without_steer_the_view_says_how_to_make_a_vector_and_bad_vectors_are_usage_errors(shell) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(setup("gpt2") + "\nbad = torch.randn(2, 32)").success
    assert shell.run_cell("%%nndebug model --view logitlens\nout = model(x)").success
    w = shell.user_ns["_nndebug_widget"]
    assert "nbdebug.steering_vector(" in w.steer_hint and "--steer" in w.steer_hint and w.steer_layers == []
    with pytest.raises(ValueError, match="steering_vector"):
        w.handle_request("steer", {"alpha": 1.0})
    for var, match in (("bad", "1-D"), ("nope", "no variable named 'nope'")):
        res = shell.run_cell(f"%%nndebug model --view logitlens --steer {var}\nran = True")
        err = res.error_in_exec or res.error_before_exec
        assert isinstance(err, UsageError) and match in str(err), err
        assert "ran" not in shell.user_ns


def test_the_steering_panel_does_not_keep_a_deleted_model(shell) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(setup("gpt2")).success
    assert shell.run_cell("%%nndebug model --view logitlens --steer v\nout = model(x)").success
    w = shell.user_ns["_nndebug_widget"]
    w.handle_request("steer", {"alpha": 2.0})
    assert shell.run_cell("import weakref\nref = weakref.ref(model)\ndel model").success
    gc.collect()
    assert shell.user_ns["ref"]() is None
    with pytest.raises(Exception, match="re-run the cell"):
        w.handle_request("steer", {"alpha": 3.0})


# -- the patched run's lens column ---------------------------------------------------------------------
def hand_patched(model: torch.nn.Module, clean: torch.Tensor, corrupt: torch.Tensor, layer: int, pos: int) -> list[torch.Tensor]:
    """The corrupt run with block ``layer``'s input at ``pos`` taken from the clean run: the residual stream
    entering each block (the patched one: after the patch) and after the last block."""
    _, _, blocks = head_of(model)
    src = hand_residuals(model, clean)[layer]  # block `layer`'s input (row `layer` of the lens)

    def put(m: Any, a: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        x = (a[0] if a else kw["hidden_states"]).clone()
        x[:, pos] = src[pos]
        return ((x, *a[1:]), kw) if a else (a, {**kw, "hidden_states": x})

    seen: list[torch.Tensor] = []
    handles = [blocks[layer].register_forward_pre_hook(put, with_kwargs=True)]
    handles += [b.register_forward_pre_hook(lambda m, a, kw: seen.append((a[0] if a else kw["hidden_states"])[0].clone()),
                                            with_kwargs=True) for b in blocks]  # after the patch: the residual entering each block
    handles.append(blocks[-1].register_forward_hook(lambda m, a, out: seen.append((out[0] if isinstance(out, tuple) else out)[0].clone())))
    try:
        with torch.no_grad():
            model(corrupt)
    finally:
        for h in handles:
            h.remove()
    return seen


def check_column(col: list[dict[str, Any]], model: torch.nn.Module, resid: list[torch.Tensor]) -> None:
    assert len(col) == len(resid)
    for entry, h in zip(col, resid):
        p = lens_probs(model, h[-1])
        assert entry["id"] == int(p.argmax())
        assert entry["p"] == pytest.approx(float(p.max()), rel=1e-4)
        assert entry["p_answer"] == pytest.approx(float(p[ANSWER]), rel=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_patched_lens_column_equals_a_hand_patched_forward(shell, family: str) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(setup(family)).success
    model = shell.user_ns["model"]
    before = fingerprint(model)
    res = shell.run_cell(f"%%nndebug model --view patching --corrupt x2 --answer {ANSWER} --wrong {WRONG}\n"
                         "with torch.inference_mode():\n    out = model(x)")
    assert res.success, res.error_in_exec
    w = shell.user_ns["_nndebug_widget"]
    x, x2 = shell.user_ns["x"], shell.user_ns["x2"]
    for row, col in ((1, 2), (0, 4), (2, 6)):
        got = w.handle_request("cell", {"sites": "resid", "method": "exact", "row": row, "col": col})[0]["result"]
        lens = got["lens"]
        assert [e["row"] for e in lens["patched"]][1:] == w.rows  # embed, then each block's output
        check_column(lens["patched"], model, hand_patched(model, x, x2, row, col))
        check_column(lens["clean"], model, hand_residuals(model, x))
        check_column(lens["corrupt"], model, hand_residuals(model, x2))
        assert lens["patched"][-1]["id"] == got["patched"][0]["id"]  # the final row is the patched run's own top-1
    assert hook_count(model) == 0 and same_fingerprint(before, fingerprint(model)) == []


def test_an_identical_cell_shows_the_corrupt_column(shell) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(setup("gpt2")).success
    assert shell.run_cell(f"%%nndebug model --view patching --corrupt x2 --answer {ANSWER}\nout = model(x)").success
    got = shell.user_ns["_nndebug_widget"].handle_request("cell", {"row": 0, "col": 0})[0]["result"]
    assert got["identical"] is True and got["lens"]["patched"] == got["lens"]["corrupt"]
