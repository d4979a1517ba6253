"""nbdebug.runs (issue 28): one own pass, interventions that compose in any order, the one reader of a
module call's first input/output (a ModelOutput too), runs stopped early, and the public API's
keyword convention with the former positional forms kept (deprecated)."""

from __future__ import annotations

import itertools
import warnings
from collections import namedtuple

import numpy as np
import pytest
import torch
from torch import nn

import nbdebug
from nbdebug.adapters.offline import tiny_lm
from nbdebug.capture.leaves import (
    first_input,
    first_output,
    replace_first_input,
    replace_first_output,
)
from nbdebug.capture.state import fingerprint, same_fingerprint, suspend_hooks
from nbdebug.runs import CallCounter, Point, own_pass, run
from nbdebug.runs.interventions import edit_activations, read_activations

IDS = torch.tensor([[1, 5, 9, 3, 7, 2]])


@pytest.fixture(scope="module")
def gpt2() -> nn.Module:
    torch.manual_seed(0)
    return tiny_lm("gpt2", layers=2, heads=2, d=16).eval()


def test_ablating_a_module_that_returns_a_model_output_changes_the_logits(gpt2: nn.Module) -> None:
    with torch.no_grad():
        before = gpt2(IDS).logits
        with nbdebug.ablate(gpt2, layers=["transformer"]):
            after = gpt2(IDS).logits
        with nbdebug.ablate(gpt2, layers=[gpt2.transformer]):  # the module itself names the layer too
            again = gpt2(IDS).logits
    # GPT2Model returns a ModelOutput; zeroing its last_hidden_state leaves lm_head (no bias) 0
    assert before.abs().max() > 0.1
    assert torch.equal(after, torch.zeros_like(after)) and torch.equal(again, after)


def _hidden(o: object) -> torch.Tensor:
    return o if isinstance(o, torch.Tensor) else o[0]  # type: ignore[index]


def _add(o: object, d: torch.Tensor) -> object:
    return o + d if isinstance(o, torch.Tensor) else (o[0] + d, *o[1:])  # type: ignore[index]


def _hand(model: nn.Module, v: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The same interventions written as plain hooks: block 0's MLP zeroed, block 1's output steered,
    block 1's output read after the steering."""
    seen: list[torch.Tensor] = []
    hs = [model.transformer.h[0].mlp.register_forward_hook(lambda m, a, o: torch.zeros_like(o)),
          model.transformer.h[1].register_forward_hook(lambda m, a, o: _add(o, alpha * v)),
          model.transformer.h[1].register_forward_hook(lambda m, a, o: seen.append(_hidden(o).clone()))]
    try:
        with torch.no_grad():
            logits = model(IDS).logits
    finally:
        for h in hs:
            h.remove()
    return logits, seen[0]


def test_ablate_steer_and_a_read_compose_in_any_order(gpt2: nn.Module) -> None:
    v = torch.linspace(-1, 1, 16)
    ref_logits, ref_read = _hand(gpt2, v, 2.0)
    calls = []
    user = gpt2.transformer.h[1].register_forward_hook(lambda m, a, o: calls.append(1) or _add(o, torch.tensor(100.0)))
    try:
        before = fingerprint(gpt2)
        items = {
            "own": lambda: own_pass(gpt2),
            "ablate": lambda: nbdebug.ablate(gpt2, layers=["transformer.h.0.mlp"]),
            "steer": lambda: nbdebug.steer(gpt2, layer=1, vector=v, alpha=2.0),
            "read": lambda: read_activations([(gpt2.transformer.h[1], "output")]),
        }
        for order in itertools.permutations(items):
            with (items[order[0]]() as a, items[order[1]]() as b, items[order[2]]() as c, items[order[3]]() as d):
                logits = gpt2(IDS).logits
            seen = dict(zip(order, (a, b, c, d)))["read"]
            torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-6, msg=str(order))
            torch.testing.assert_close(seen[0][0], ref_read, rtol=0, atol=1e-6, msg=str(order))
        assert calls == []  # the user's hook was set aside in every order; ours were kept
        assert same_fingerprint(before, fingerprint(gpt2)) == []
    finally:
        user.remove()


def test_suspend_hooks_keeps_interventions_but_not_the_users(gpt2: nn.Module) -> None:
    mlp = gpt2.transformer.h[0].mlp
    seen = []
    user = mlp.register_forward_hook(lambda m, a, o: seen.append("user"))
    try:
        with edit_activations([((mlp, "output"), lambda x: seen.append("ours") or None)]), suspend_hooks(gpt2), torch.no_grad():
            gpt2(IDS)
    finally:
        user.remove()
    assert seen == ["ours"]


def test_run_stops_after_the_last_read_and_equals_a_full_forward(gpt2: nn.Module) -> None:
    after = []
    h = gpt2.lm_head.register_forward_pre_hook(lambda m, a: after.append(1))
    try:
        full = run(gpt2, IDS, reads=[gpt2.transformer.h[0], (gpt2.transformer.h[1], "input")])
        cut = run(gpt2, IDS, reads=[gpt2.transformer.h[0], (gpt2.transformer.h[1], "input")], stop=True)
    finally:
        h.remove()
    assert after == []  # own passes: the user's hook is set aside
    assert cut.output is None and full.output is not None
    for x, y in zip(full.reads, cut.reads):
        assert x is not None and y is not None and torch.equal(x, y)
    torch.testing.assert_close(full.reads[0], full.reads[1], rtol=0, atol=0)  # block 0's output is block 1's input


def test_a_point_names_one_call_of_a_module_run_twice() -> None:
    relu = nn.ReLU()
    model = nn.Sequential(nn.Linear(3, 3), relu, nn.Linear(3, 3), relu)
    x = torch.randn(2, 3)
    r = run(model, x, edits=[(Point(relu, "output", call=1), lambda t: t * 0)], reads=[Point(relu, "output", 0)])
    assert torch.equal(r.output, torch.zeros(2, 3))
    with torch.no_grad():
        assert torch.equal(r.reads[0], torch.relu(model[0](x)))
    assert Point.of(relu) == Point(relu, "output", None) and Point.of((relu, "input", 2)).call == 2
    with pytest.raises(ValueError, match="'input' or 'output'"):
        Point.of((relu, "middle"))
    c = CallCounter(1)
    assert [c.this_one(0, 1) for _ in range(3)] == [False, True, False]


def test_the_one_reader_of_first_inputs_and_outputs() -> None:
    from transformers.modeling_outputs import BaseModelOutputWithPast

    a, b = torch.ones(2), torch.zeros(2)
    out = BaseModelOutputWithPast(last_hidden_state=a, hidden_states=(b,))
    assert first_output(out) is a and first_output((None, [b, a])) is b and first_output("x") is None
    new = replace_first_output(out, lambda t: t + 1)
    assert type(new) is BaseModelOutputWithPast and torch.equal(new.last_hidden_state, a + 1) and new.hidden_states[0] is b
    pair = namedtuple("pair", "x y")(a, b)
    swapped = replace_first_output(pair, lambda t: t)  # an identity edit stops at the first tensor
    assert swapped.x is a and swapped.y is b and type(swapped).__name__ == "pair"
    assert torch.equal(replace_first_output([None, (a, b)], lambda t: -t)[1][0], -a)
    assert first_input((), {"mask": None, "hidden_states": b}) is b and first_input(("s", a), {}) is None
    args, kwargs = replace_first_input((), {"hidden_states": b, "other": a}, a)
    assert args == () and kwargs["hidden_states"] is a and kwargs["other"] is a


def test_positional_steer_and_steering_vector_still_work_with_a_warning(gpt2: nn.Module) -> None:
    v = torch.ones(16)
    with torch.no_grad(), nbdebug.steer(gpt2, layer=1, vector=v, alpha=0.5):
        want = gpt2(IDS).logits
    with pytest.warns(DeprecationWarning, match="steer: pass layer=, vector=, alpha= as keywords"):
        with torch.no_grad(), nbdebug.steer(gpt2, 1, v, 0.5):
            got = gpt2(IDS).logits
    assert torch.equal(got, want)
    pos, neg = [torch.tensor([1, 2, 3])], [torch.tensor([4, 5, 6])]
    new = nbdebug.steering_vector(gpt2, pos, neg, layer="transformer.h.0")
    with pytest.warns(DeprecationWarning, match="steering_vector: pass tokenizer="):
        old = nbdebug.steering_vector(gpt2, None, pos, neg, "transformer.h.0")
    assert torch.equal(new, old) and new.abs().max() > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(nbdebug.steering_vector(gpt2, positive=pos, negative=neg, layer=0), new)


def test_patch_grid_identical_cells_hold_the_unpatched_metric(gpt2: nn.Module) -> None:
    clean, corrupt = torch.tensor([[1, 5, 9, 3, 7, 2]]), torch.tensor([[1, 5, 9, 4, 7, 2]])
    g = nbdebug.patch(gpt2, clean, corrupt, answer=3, wrong=4, progress=False)
    assert g.identical[:, :3].all() and not g.identical[1:, 3:].any()  # row 0 (embeddings) differs at 3 only
    assert (g.effect[g.identical] == 0.0).all() and np.isfinite(g.effect).all()
    assert int(np.argmax(g.effect)) == int(np.nanargmax(np.where(g.identical, np.nan, g.effect)))  # numpy works
    assert all(not g.identical[r, c] for r, c in g.top_cells(100)) and g.top_cells(100)  # identical cells are not "top" cells


def test_results_show_their_views(gpt2: nn.Module) -> None:
    from nbdebug.widgets.attribution import AttributionWidget
    from nbdebug.widgets.patching import PatchingWidget

    clean, corrupt = torch.tensor([[1, 5, 9, 3]]), torch.tensor([[1, 5, 9, 4]])
    g = nbdebug.patch(gpt2, clean, corrupt, answer=3, wrong=4, progress=False)
    w = g.show()
    assert isinstance(w, PatchingWidget) and w.grid is g and w.rows == g.rows and w.metric == g.metric
    with pytest.raises(ValueError, match="only the resid grid"):
        w.session.grid("heads", "exact")
    a = nbdebug.attribute(gpt2, clean, answer=3, wrong=4, faithfulness=False)
    aw = a.show()
    assert isinstance(aw, AttributionWidget) and aw.result is a and aw.data["scores"] == [float(s) for s in a.scores]


def test_hookless_copy_holds_none_of_the_users_hooks() -> None:
    from nbdebug.runs.own import hookless_copy

    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    calls: list[str] = []
    model[0].register_forward_hook(lambda *_: calls.append("user"))
    memo: dict[int, object] = {}
    clone = hookless_copy(model, memo)
    x = torch.randn(2, 3)
    assert torch.equal(clone(x), model(x)) and calls == ["user"]  # the copy ran no hook; the model's still runs
    assert len(clone[0]._forward_hooks) == 0 and len(model[0]._forward_hooks) == 1
    assert memo[id(model[0].weight)] is clone[0].weight  # the memo maps the user's parameters to the copy's


def test_labelled_progress_is_the_one_bar(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The CAM methods' reporter draws runs.progress.Progress: nothing for a quick label, nothing first
    drawn at a label's end, the plain line once a label has run ``delay`` seconds (no tqdm)."""
    import sys

    from nbdebug.runs import progress as mod

    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    now = [0.0]
    monkeypatch.setattr(mod.time, "perf_counter", lambda: now[0])
    bar = mod.LabelledProgress(delay=0.5)
    bar("deletion", 1, 4)
    bar("deletion", 4, 4)  # finished before the delay: never drawn
    assert capsys.readouterr().err == ""
    bar("insertion", 1, 4)
    now[0] += 0.6
    bar("insertion", 2, 4)
    bar("insertion", 4, 4)
    bar.close()
    err = capsys.readouterr().err
    assert "nbdebug insertion: 2/4" in err and "nbdebug insertion: 4/4" in err and err.endswith("\n")


def test_hookless_copy_refuses_an_offloaded_model_and_its_callers_say_not_checked() -> None:
    """A copy of an accelerate-offloaded model keeps reloading the offloaded weights at every forward, so
    nothing written into it counts. Planted by accelerate itself: without the refusal the CAM sanity check
    scores Grad-CAM ρ = 1.00 ("does not depend on the class decision") and the doctor's overfit run says
    "the loss never moved … nothing was updated" — both false of this model (ρ −0.37 and a falling loss
    unoffloaded)."""
    pytest.importorskip("accelerate")
    from accelerate import cpu_offload

    from nbdebug.recorders.gradcam import GradCamRecorder
    from nbdebug.runs.own import NotCopyable, hookless_copy
    from tests.unit.test_gradcam_sanity import TwoHeads

    torch.manual_seed(0)
    model = TwoHeads().eval()
    x = torch.randn(1, 3, 8, 8)
    cpu_offload(model, execution_device=torch.device("cpu"))
    assert model.fc2.weight.device.type == "meta"
    with pytest.raises(NotCopyable, match=r"offloads the weights of .* load the model without CPU/disk offload"):
        hookless_copy(model)
    rec = GradCamRecorder(model, gradcam_layer="act", cam_method="gradcam", sanity=True, cam_topk=2)
    with rec, torch.no_grad():
        model(x)
    res = rec.result()
    assert not res.sanity, res.sanity  # no ρ at all rather than a false 1.00
    assert any("sanity: the model could not be copied (NotCopyable: accelerate offloads" in n for n in res.notes)
    assert not any("does not depend on the class decision" in n for n in res.notes)

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    cpu_offload(mlp, execution_device=torch.device("cpu"))
    with pytest.raises(ValueError, match="doctor trains a copy of the model: accelerate offloads"):
        nbdebug.doctor(mlp, torch.randn(16, 8), torch.randint(0, 3, (16,)), steps=5)


def test_hookless_copy_of_a_model_holding_a_tensor_from_its_forward() -> None:
    """``self.last = y`` in ``forward`` (a user keeping an activation) leaves a non-leaf tensor on the module,
    which ``copy.deepcopy`` refuses: the copy takes it detached, the user's tensor stays the same object
    with its graph, and the doctor (which trains such a copy) runs. Without it: RuntimeError "Only Tensors
    created explicitly by the user (graph leaves) support the deepcopy protocol"."""
    from nbdebug.runs.own import hookless_copy

    class Keeps(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)
            self.last: torch.Tensor | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            self.last = y
            return y

    torch.manual_seed(0)
    model = Keeps()
    x = torch.randn(5, 4)
    model(x)
    kept = model.last
    assert kept is not None and kept.grad_fn is not None
    clone = hookless_copy(model)
    assert clone.last is not kept and clone.last.grad_fn is None and torch.equal(clone.last, kept)
    assert model.last is kept and kept.grad_fn is not None
    assert torch.equal(clone(x), model(x))
    report = nbdebug.doctor(model, x, torch.randint(0, 3, (5,)), steps=3)
    assert "init_loss" in report.checks


def test_the_sanity_checks_copy_shares_all_but_the_layers_it_reinitialises() -> None:
    """The CAM sanity check copies only the layers after the CAM layer (``hookless_copy(own=...)``): the
    conv before it stays the user's tensor (a big backbone is not duplicated), while the re-initialised
    layers and their buffers are the copy's own — a BatchNorm's ``reset_parameters`` zeroes its running
    statistics in place and MultiheadAttention's resets its ``out_proj`` child, which must not reach the
    user's model. The ρ equal those of a full deep copy. Planted: the full copy (no sharing) fails the
    first check; sharing the re-initialised modules' buffers or children changes the user's model."""
    from nbdebug.cams import checks
    from nbdebug.capture import fingerprint, same_fingerprint
    from nbdebug.recorders.gradcam import GradCamRecorder

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.act = nn.ReLU()
            self.pool = nn.AdaptiveAvgPool2d(2)
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.bn = nn.BatchNorm1d(32)
            self.fc = nn.Linear(32, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            t = self.pool(self.act(self.conv(x))).flatten(2).transpose(1, 2)  # (B, 4, 8)
            t = self.attn(t, t, t, need_weights=False)[0]
            return self.fc(self.bn(t.flatten(1)))

    torch.manual_seed(0)
    model = Net()
    x = torch.randn(4, 3, 8, 8)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 3, 8, 8))  # running statistics away from their reset values
    model.eval()
    clones: list[nn.Module] = []
    real = checks.hookless_copy

    def spy(*a: object, **k: object) -> nn.Module:
        clones.append(real(*a, **k))  # type: ignore[arg-type]
        return clones[-1]

    before = fingerprint(model)
    mp = pytest.MonkeyPatch()
    mp.setattr(checks, "hookless_copy", spy)
    try:
        rec = GradCamRecorder(model, gradcam_layer="act", cam_method="gradcam,hirescam", sanity=True, cam_topk=2)
        with rec, torch.no_grad():
            model(x)
        res = rec.result()
    finally:
        mp.undo()
    (clone,) = clones
    assert clone.conv.weight is model.conv.weight and clone.conv.bias is model.conv.bias
    assert clone.fc.weight is not model.fc.weight and clone.bn.running_mean is not model.bn.running_mean
    assert clone.attn.out_proj.bias is not model.attn.out_proj.bias
    assert same_fingerprint(before, fingerprint(model)) == []
    mp.setattr(checks, "hookless_copy", lambda m, *a, **k: real(m))  # the full copy, as before: the same ρ
    try:
        rec2 = GradCamRecorder(model, gradcam_layer="act", cam_method="gradcam,hirescam", sanity=True, cam_topk=2)
        with rec2, torch.no_grad():
            model(x)
        full = rec2.result().sanity
    finally:
        mp.undo()
    assert res.sanity and res.sanity == full
