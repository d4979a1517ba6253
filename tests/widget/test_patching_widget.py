"""`%%nndebug model --view patching`: the cell's forward is the clean run, ``--corrupt`` the corrupt one.

Through a fresh ``InteractiveShell`` on tiny random GPT-2 / Llama models: the grid the magic binds and
the widget syncs equals ``nbdebug.patch`` on the same inputs; the site selector's requests equal
``patch(sites=...)``; a click's top-5 equals a hand-patched forward (plain hooks); no hook is left and
the model is unchanged, also when the cell runs under ``no_grad``/``inference_mode``; a click does not
record the clean or corrupt run again; bad options are ``UsageError``s before the cell runs.
"""

from __future__ import annotations

import gc
import html
import re
from typing import Any

import numpy as np
import pytest
import torch
from IPython.core.error import UsageError

import nbdebug
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.inspectors.token_headlines import patch_headline
from nbdebug.widgets._transport import decode_array

ANSWER, WRONG = 3, 4


def setup(family: str) -> str:
    return f"""
import torch
from nbdebug.adapters.offline import tiny_lm
model = tiny_lm({family!r}, layers=3, heads=4, d=32)
x = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(1))
x2 = x.clone(); x2[0, 2] = (x2[0, 2] + 7) % 64; x2[0, 4] = (x2[0, 4] + 11) % 64
"""


MAGIC = f"%%nndebug model --view patching --corrupt x2 --answer {ANSWER} --wrong #{WRONG} -o g"


def run(shell: Any, family: str, body: str = "out = model(x)", extra: str = "") -> Any:
    assert shell.run_cell(setup(family)).success
    res = shell.run_cell(f"{MAGIC} {extra}\n{body}")
    assert res.success, res.error_in_exec
    return shell.user_ns["_nndebug_widget"]


def answer_arrays(content: dict[str, Any], buffers: list[Any]) -> dict[str, np.ndarray]:
    return {name: decode_array({"view": buffers[m["buffer"]], "dtype": m["dtype"], "shape": m["shape"]})
            for name, m in content["arrays"].items()}


def reference(shell: Any, sites: str, method: str = "exact") -> Any:
    ns = shell.user_ns
    return nbdebug.patch(ns["model"], ns["x"], ns["x2"], answer=ANSWER, wrong=WRONG, sites=sites, method=method)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids)
    return (out if isinstance(out, torch.Tensor) else out.logits)[0, -1].double()


def top5(z: torch.Tensor) -> list[int]:
    return [int(i) for i in torch.softmax(z, -1).topk(5).indices]


def hand_patched_resid(model: torch.nn.Module, block: torch.nn.Module, clean: torch.Tensor, corrupt: torch.Tensor,
                       pos: int) -> torch.Tensor:
    """The corrupt run with ``block``'s input at ``pos`` taken from the clean run (plain hooks, full forwards)."""
    seen: list[torch.Tensor] = []

    def first(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        return args[0] if args else kwargs["hidden_states"]

    h = block.register_forward_pre_hook(lambda m, a, kw: seen.append(first(a, kw).detach().clone()), with_kwargs=True)
    try:
        logits(model, clean)
    finally:
        h.remove()

    def put(m: Any, a: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        x = first(a, kw).clone()
        x[:, pos] = seen[0][:, pos]
        return ((x, *a[1:]), kw) if a else (a, {**kw, "hidden_states": x})

    h = block.register_forward_pre_hook(put, with_kwargs=True)
    try:
        return logits(model, corrupt)
    finally:
        h.remove()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_grid_equals_nbdebug_patch_and_the_site_switch_equals_patch_sites(shell, family: str) -> None:  # type: ignore[no-untyped-def]
    w = run(shell, family)
    ref = reference(shell, "resid")
    g = shell.user_ns["g"]
    np.testing.assert_allclose(g.effect, ref.effect, rtol=1e-5, atol=1e-6, equal_nan=True)
    shown = np.where(ref.identical, np.nan, ref.effect).astype(np.float32)  # identical cells: grey "=" in the view
    np.testing.assert_allclose(decode_array(w.effect), shown, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert w.rows == ref.rows and len(w.columns) == 7 and w.sites == "resid"
    assert w.row_labels == [f"block {k} input" for k in range(3)]  # resid rows are the blocks' inputs
    assert w.headline == patch_headline(ref.effect, w.columns, f"'{w.answer_clean['token']}'",
                                        [x.layer for x in ref.row_sites], "resid", labels=w.row_labels)
    page = w.fallback_html()
    assert page.index(html.escape(w.headline)) < page.index("<table")
    printed = [float(t) for t in re.findall(r">(-?\d\.\d\d)</td>", page)]
    shown = ref.effect[np.isfinite(ref.effect) & (np.abs(ref.effect) >= 0.05) & ~ref.identical]
    assert sorted(printed) == sorted(round(float(v), 2) for v in shown)  # numbers only where |effect| ≥ 0.05
    assert np.isnan(decode_array(w.effect)[:, :2]).all() and decode_array(w.identical)[:, :2].all()  # before the first change
    assert w.metric_clean == pytest.approx(ref.metric_clean) and w.metric_corrupt == pytest.approx(ref.metric_corrupt)
    for sites in ("attn", "mlp", "heads"):
        content, buffers = w.handle_request("grid", {"sites": sites, "method": "exact"})
        got, want = answer_arrays(content, buffers), reference(shell, sites)
        np.testing.assert_allclose(got["effect"], np.where(want.identical, np.nan, want.effect).astype(np.float32),
                                   rtol=1e-4, atol=1e-5, equal_nan=True)
        assert content["result"]["rows"] == want.rows and content["result"]["sites"] == sites
        assert w.sites == sites and w.rows == want.rows  # the traits follow (a re-render shows the same grid)
    content, buffers = w.handle_request("grid", {"sites": "heads", "method": "attribution"})
    est = reference(shell, "heads", "attribution")
    np.testing.assert_allclose(answer_arrays(content, buffers)["effect"], est.effect.astype(np.float32), rtol=1e-4, atol=1e-5)
    verified = content["result"]["verified"]
    assert verified and w.method == "attribution"
    exact = reference(shell, "heads").effect
    for r, c, v in verified:  # the triage's marked cells hold the exact effect
        assert v == pytest.approx(float(exact[r, c]), rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("mode", ["plain", "no_grad", "inference_mode"])
def test_a_click_equals_a_hand_patched_forward_and_leaves_the_model_as_found(shell, family: str, mode: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    body = {"plain": "out = model(x)", "no_grad": "with torch.no_grad():\n    out = model(x)",
            "inference_mode": "with torch.inference_mode():\n    out = model(x)"}[mode]
    assert shell.run_cell(setup(family)).success
    model = shell.user_ns["model"]
    before = fingerprint(model)
    res = shell.run_cell(f"{MAGIC}\n{body}")
    assert res.success, res.error_in_exec
    w = shell.user_ns["_nndebug_widget"]
    x, x2 = shell.user_ns["x"], shell.user_ns["x2"]

    import nbdebug.workbench.session as session_mod
    recorded: list[Any] = []
    real = session_mod.record_state
    monkeypatch.setattr(session_mod, "record_state", lambda *a, **k: recorded.append(1) or real(*a, **k))
    row, col = 1, 2
    content, _ = w.handle_request("cell", {"sites": "resid", "method": "exact", "row": row, "col": col})
    got = content["result"]
    assert recorded == []  # the clean and corrupt runs were recorded once, not again for the click
    block = dict(model.named_modules())[w.rows[row]]
    want = hand_patched_resid(model, block, x, x2, col)
    assert [t["id"] for t in got["patched"]] == top5(want)
    np.testing.assert_allclose([t["p"] for t in got["patched"]], torch.softmax(want, -1).topk(5).values.numpy(), rtol=1e-4)
    assert [t["id"] for t in got["clean"]] == top5(logits(model, x))
    assert [t["id"] for t in got["corrupt"]] == top5(logits(model, x2))
    assert got["effect"] == pytest.approx(float(shell.user_ns["g"].effect[row, col]), rel=1e-4, abs=1e-5)
    # the answer's own p and rank in every run, in or out of its top-5
    for run_name, z in (("patched", want), ("clean", logits(model, x)), ("corrupt", logits(model, x2))):
        a = got["answer"][run_name]
        assert a["id"] == ANSWER and a["p"] == pytest.approx(float(torch.softmax(z, -1)[ANSWER]), rel=1e-4)
        assert a["rank"] == int((z > z[ANSWER]).sum()) + 1
    assert w.answer_clean["rank"] == got["answer"]["clean"]["rank"]
    assert w.selected == [row, col] and w.clicks == 1
    assert hook_count(model) == 0 and same_fingerprint(before, fingerprint(model)) == []


def test_a_click_on_an_identical_cell_answers_without_running(shell) -> None:  # type: ignore[no-untyped-def]
    w = run(shell, "gpt2")
    content, _ = w.handle_request("cell", {"row": 0, "col": 0})
    assert content["result"]["identical"] is True and content["result"]["patched"] == content["result"]["corrupt"]


@pytest.mark.parametrize(("extra_line", "match"), [
    ("%%nndebug model --view patching --answer 3 --wrong 4", "needs a corrupt prompt"),
    ("%%nndebug model --view patching --corrupt nope --answer 3", "no variable named 'nope'"),
    ("%%nndebug model --view patching --corrupt x2", "needs --answer"),
    ("%%nndebug model --view patching --corrupt x2 --answer ' Paris'", "pass tokenizer="),
    ("%%nndebug model --view patching --corrupt x2 --answer 3 --wrong 3", "the same token"),
    ("%%nndebug model --view patching --corrupt x2 --answer 3 --sites neurons", "invalid choice"),
])
def test_bad_options_are_usage_errors_before_the_cell_runs(shell, extra_line: str, match: str) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(setup("gpt2")).success
    res = shell.run_cell(f"{extra_line}\nran = True")
    err = res.error_in_exec or res.error_before_exec
    assert err is not None and match in str(err), err
    assert isinstance(err, UsageError), type(err)
    assert "ran" not in shell.user_ns


def test_prompts_of_different_lengths_are_a_note_and_the_cell_is_kept(shell) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(setup("gpt2") + "\nshort = x2[:, :5]").success
    res = shell.run_cell("%%nndebug model --view patching --corrupt short --answer 3 -o g\nout = model(x); ran = 1")
    assert res.success and shell.user_ns["ran"] == 1 and shell.user_ns["g"] is None
    notes = [str(d.get("text/plain", "")) for d in shell.displayed]
    assert any("--corrupt has 5 tokens, the cell's prompt 7" in n and "same number of tokens" in n for n in notes), notes


def test_a_prompt_string_and_the_tokenizer(shell) -> None:  # type: ignore[no-untyped-def]
    """--corrupt a string, --answer/--wrong text through --tokenizer (a whitespace tokenizer here)."""
    assert shell.run_cell(setup("gpt2") + '''
class Tok:
    words = {w: i for i, w in enumerate("the a tower colosseum eiffel is in city of paris rome".split())}
    def encode(self, text, add_special_tokens=False):
        return [self.words[w] for w in text.split()]
    def decode(self, ids):
        inv = {i: w for w, i in self.words.items()}
        return " ".join(inv.get(i, f"#{i}") for i in ids)
    def __call__(self, text, return_tensors="pt"):
        return {"input_ids": torch.tensor([self.encode(text)])}
tok = Tok()
clean = torch.tensor([tok.encode("the eiffel tower is in the city of")])
corrupt = "the colosseum tower is in the city of"
''').success
    res = shell.run_cell("%%nndebug model --view patching --corrupt corrupt --answer paris --wrong rome --tokenizer tok -o g\n"
                         "out = model(clean)")
    assert res.success, res.error_in_exec
    g, w = shell.user_ns["g"], shell.user_ns["_nndebug_widget"]
    ns = shell.user_ns
    ref = nbdebug.patch(ns["model"], ns["clean"], ns["corrupt"], answer="paris", wrong="rome", tokenizer=ns["tok"])
    np.testing.assert_allclose(g.effect, ref.effect, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert w.tokens_corrupt[1] == "colosseum" and "paris" in w.metric
    assert all(isinstance(t["token"], str) for t in w.top_clean)


def test_the_widget_does_not_keep_a_deleted_model(shell) -> None:  # type: ignore[no-untyped-def]
    w = run(shell, "gpt2")
    w.handle_request("grid", {"sites": "attn"})
    w.handle_request("cell", {"row": 1, "col": 3})
    assert shell.run_cell("import weakref\nref = weakref.ref(model)\ndel model\ngc_done = __import__('gc').collect()").success
    gc.collect()
    assert shell.user_ns["ref"]() is None
    assert w.handle_request("grid", {"sites": "attn"})[0]["result"]["sites"] == "attn"  # computed before: cached
    with pytest.raises(Exception, match="re-run the cell"):
        w.handle_request("cell", {"row": 1, "col": 3})
    assert "nbdebug-patching-static" in w.safe_fallback_html()
