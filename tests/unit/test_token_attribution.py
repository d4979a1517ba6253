"""nbdebug.attribute (issue 21, tokens): gradient × input equal to a hand gradient on the embedding
output, integrated gradients equal to captum's IntegratedGradients for every integration rule,
occlusion equal to a hand loop, the completeness delta and the faithfulness curves by their formulas,
on tiny random GPT-2 and Llama (GQA) built from configs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import nbdebug
from nbdebug.adapters.offline import tiny_lm
from nbdebug.attribution import attribute
from nbdebug.attribution.methods import ig_path, occluded
from nbdebug.workbench.metric import MetricError

FAMILIES = ["gpt2", "llama"]
A, W = 3, 5


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request: Any) -> tuple[str, torch.nn.Module, torch.Tensor]:
    m = tiny_lm(request.param, d=32, heads=4)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (1, 7), generator=g)
    return request.param, m, ids


def metric_of(model: torch.nn.Module, embs: torch.Tensor, wrong: int | None = W) -> torch.Tensor:
    """The hand metric: the model called with inputs_embeds (its embedding module's output replaced)."""
    logits = model(inputs_embeds=embs).logits[:, -1].float()
    return logits[:, A] - logits[:, wrong] if wrong is not None else torch.log_softmax(logits, -1)[:, A]


def clean_embeddings(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.get_input_embeddings()(ids).detach()


def test_grad_x_input_equals_hand_gradient(lm: Any) -> None:
    _, model, ids = lm
    e = clean_embeddings(model, ids).requires_grad_(True)
    m = metric_of(model, e)
    (g,) = torch.autograd.grad(m.sum(), e)
    hand = (g * e).sum(-1)[0].detach().numpy()
    a = attribute(model, ids, answer=A, wrong=W, method="grad_x_input", faithfulness=False)
    np.testing.assert_allclose(a.scores, hand, rtol=1e-5, atol=1e-7)
    assert a.metric == pytest.approx(float(m.detach()), rel=1e-6)
    assert a.method == "grad_x_input" and a.tokens == [str(i) for i in ids[0].tolist()] and a.delta is None
    assert np.abs(a.scores).max() > 0


def test_no_wrong_is_the_answers_log_probability_as_in_patch(lm: Any) -> None:
    _, model, ids = lm
    e = clean_embeddings(model, ids).requires_grad_(True)
    m = metric_of(model, e, wrong=None)
    (g,) = torch.autograd.grad(m.sum(), e)
    a = attribute(model, ids, answer=A, method="grad_x_input", faithfulness=False)
    np.testing.assert_allclose(a.scores, (g * e).sum(-1)[0].detach().numpy(), rtol=1e-5, atol=1e-7)
    assert a.metric == pytest.approx(float(m.detach()), rel=1e-6) and a.label == "log p('3')"
    # the one convention (nbdebug.workbench.metric): patch measures the same thing without wrong=
    from nbdebug.workbench.metric import Metric

    assert Metric.build(answer=A).label == a.label
    with pytest.warns(DeprecationWarning, match="answer="):  # positional answer/wrong: deprecated, still works
        old = attribute(model, ids, A, method="grad_x_input", faithfulness=False)
    np.testing.assert_array_equal(old.scores, a.scores)


@pytest.mark.parametrize("rule", ["gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid"])
def test_integrated_gradients_equals_captum(lm: Any, rule: str) -> None:
    captum = pytest.importorskip("captum.attr")
    _, model, ids = lm
    e = clean_embeddings(model, ids)
    ig = captum.IntegratedGradients(lambda x: metric_of(model, x))
    ref, delta = ig.attribute(e, baselines=torch.zeros_like(e), n_steps=16, method=rule, return_convergence_delta=True)
    # a small budget: the 16 steps run in several chunks, summed as they come
    a = attribute(model, ids, answer=A, wrong=W, method="integrated_gradients", steps=16, ig_rule=rule, faithfulness=False,
                  max_bytes=3 * 7 * 32 * 62 * 4)
    np.testing.assert_allclose(a.scores, ref.sum(-1)[0].detach().numpy(), atol=1e-4, rtol=1e-4)
    assert a.delta == pytest.approx(float(delta), abs=1e-4)


def test_ig_path_is_captums() -> None:
    """The path captum's IntegratedGradients uses for each rule, written out by hand (captum's own table
    lives in a private module, ``captum.attr._utils.approximation_methods``): points in (0, 1) and their
    weights; the end-to-end comparison with ``IntegratedGradients`` is the test above."""
    n = 9
    nodes, weights = np.polynomial.legendre.leggauss(n)
    k = np.arange(n)
    trapezoid = np.full(n, 1 / n)  # captum's: 1/n, the two ends halved (its weights sum to 1 - 1/n)
    trapezoid[[0, -1]] /= 2
    expected = {
        "gausslegendre": ((nodes + 1) / 2, weights / 2),
        "riemann_left": (k / n, np.full(n, 1 / n)),
        "riemann_right": ((k + 1) / n, np.full(n, 1 / n)),
        "riemann_middle": ((k + 0.5) / n, np.full(n, 1 / n)),
        "riemann_trapezoid": (k / (n - 1), trapezoid),
    }
    for rule, (alphas, sizes) in expected.items():
        a, w = ig_path(n, rule)
        np.testing.assert_allclose(a, alphas, atol=1e-7, err_msg=rule)
        np.testing.assert_allclose(w, sizes, atol=1e-12, err_msg=rule)


def test_completeness_delta_formula_and_fix_first(lm: Any) -> None:
    _, model, ids = lm
    e = clean_embeddings(model, ids)
    for fix_first in (False, True):
        b = torch.zeros_like(e)
        if fix_first:
            b[:, 0] = e[:, 0]
        a = attribute(model, ids, answer=A, wrong=W, method="integrated_gradients", steps=32, fix_first=fix_first, faithfulness=False)
        with torch.no_grad():
            mx, mb = float(metric_of(model, e)), float(metric_of(model, b))
        assert a.metric == pytest.approx(mx, rel=1e-5, abs=1e-6)
        assert a.metric_baseline == pytest.approx(mb, rel=1e-5, abs=1e-6)
        assert a.delta == pytest.approx(a.scores.sum() - (mx - mb), abs=1e-6)
        assert a.converged == (abs(a.delta) <= 0.05 * abs(mx - mb))
        assert a.steps == 32
        if fix_first:
            assert a.scores[0] == 0.0 and "first token fixed" in a.baseline
    # a tiny random model is nearly linear along the path: 32 Gauss–Legendre steps are complete
    assert a.converged and a.relative_delta < 1e-3


def test_occlusion_equals_hand_loop(lm: Any) -> None:
    _, model, ids = lm
    e = clean_embeddings(model, ids)
    hand = []
    with torch.no_grad():
        mx = float(metric_of(model, e))
        for t in range(ids.shape[1]):
            x = e.clone()
            x[:, t] = 0
            hand.append(mx - float(metric_of(model, x)))
    a = attribute(model, ids, answer=A, wrong=W, method="occlusion", faithfulness=False, max_bytes=20_000)
    np.testing.assert_allclose(a.scores, hand, rtol=1e-5, atol=1e-6)


def test_faithfulness_curves(lm: Any) -> None:
    _, model, ids = lm
    torch_state, np_state = torch.get_rng_state(), np.random.get_state()
    a = attribute(model, ids, answer=A, wrong=W, method="grad_x_input")
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.array_equal(np.random.get_state()[1], np_state[1])  # the user's random state untouched
    T = ids.shape[1]
    d, r = a.curves["deletion"], a.curves["random"]
    assert d.shape == r.shape == (T + 1,) and a.random_curves.shape == (10, T + 1)
    assert d[0] == r[0] == 1.0 and d[-1] == r[-1] == 0.0
    # the curve's second point by hand: the top token replaced by the zero baseline
    e = clean_embeddings(model, ids)
    x = e.clone()
    x[:, int(np.argmax(a.scores))] = 0
    with torch.no_grad():
        mx, mk, mb = (float(metric_of(model, v)) for v in (e, x, torch.zeros_like(e)))
    assert d[1] == pytest.approx((mk - mb) / (mx - mb), rel=1e-4, abs=1e-5)
    x_ = np.linspace(0, 1, T + 1)
    assert a.faithfulness["deletion"] == pytest.approx(np.trapezoid(d, x_))
    assert a.faithfulness["random"] == pytest.approx(np.trapezoid(r, x_))
    np.testing.assert_allclose(r, a.random_curves.mean(0))
    again = attribute(model, ids, answer=A, wrong=W, method="grad_x_input")
    np.testing.assert_array_equal(again.random_curves, a.random_curves)  # seeded
    other = attribute(model, ids, answer=A, wrong=W, method="grad_x_input", seed=1)
    assert not np.array_equal(other.random_curves, a.random_curves)


def test_faithfulness_runs_each_distinct_input_once(lm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every point of every curve (the score order and each random order, drawn from
    ``default_rng(seed)`` as documented) equals the hand metric of the prompt with that order's first
    ``k`` tokens replaced; the model ran each distinct input once: orders sharing a replaced set, and
    with ``fix_first`` sets differing only in the first token (its baseline row is its own embedding),
    are one run. Planted: runs not deduplicated (the count), or results mapped back to the wrong rows."""
    from nbdebug.attribution.runs import EmbeddingRuns

    _, model, ids = lm
    rows: list[int] = []
    metric = EmbeddingRuns.metric

    def counted(self: EmbeddingRuns, embs: torch.Tensor) -> torch.Tensor:
        rows.append(int(embs.shape[0]))
        return metric(self, embs)

    monkeypatch.setattr(EmbeddingRuns, "metric", counted)
    a = attribute(model, ids, answer=A, wrong=W, method="grad_x_input", fix_first=True, orders=10, seed=3)
    T = ids.shape[1]
    rng = np.random.default_rng(3)
    perms = [np.argsort(-a.scores, kind="stable")] + [rng.permutation(T) for _ in range(10)]
    e = clean_embeddings(model, ids)
    base = torch.zeros_like(e)
    base[:, 0] = e[:, 0]
    with torch.no_grad():
        mx, mb = float(metric_of(model, e)), float(metric_of(model, base))
        curves = []
        for p in perms:
            row = []
            for k in range(T + 1):
                x = e.clone()
                x[:, p[:k]] = base[:, p[:k]]
                row.append((float(metric_of(model, x)) - mb) / (mx - mb))
            curves.append(row)
    np.testing.assert_allclose(a.curves["deletion"], curves[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(a.random_curves, curves[1:], rtol=1e-4, atol=1e-5)
    distinct = {frozenset(int(t) for t in p[:k] if t != 0) for p in perms for k in range(T + 1)}
    assert rows == [len(distinct)] and len(distinct) < len(perms) * (T - 1) + 2, (rows, len(distinct))


def test_occlusion_masks_built_on_the_cpu_meet_the_embeddings_device() -> None:
    """``occluded`` gets CPU masks (occlusion, deletion curves) and the embeddings on the model's device: the
    result is on that device (``meta`` stands in for a GPU here). Planted: the CPU mask passed as is."""
    clean, base = torch.zeros(3, 4, device="meta"), torch.ones(3, 4, device="meta")
    masks = torch.tensor([[False, False, False], [True, False, True]])
    assert occluded(clean, base, masks).device.type == "meta"
    got = occluded(torch.zeros(3, 4), torch.ones(3, 4), masks)
    assert got[:, :, 0].tolist() == [[0.0, 0.0, 0.0], [1.0, 0.0, 1.0]]


class ToyTok:
    """A tokenizer of single letters: 'a' is id 0 ... 'z' is 25; ' ab' is two tokens."""

    def encode(self, s: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) - 97 for c in s.replace(" ", "")]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i) for i in ids)

    def __call__(self, s: str, return_tensors: str = "pt") -> dict[str, torch.Tensor]:
        return {"input_ids": torch.tensor([self.encode(s)])}


def test_strings_with_a_tokenizer_and_errors() -> None:
    model = tiny_lm("gpt2")
    tok = ToyTok()
    a = attribute(model, "hello", answer="d", wrong="f", tokenizer=tok, faithfulness=False)
    b = attribute(model, torch.tensor([tok.encode("hello")]), answer=3, wrong=5, faithfulness=False)
    np.testing.assert_array_equal(a.scores, b.scores)
    assert a.tokens == list("hello") and a.label == "logit['d'] - logit['f']"
    with pytest.raises(MetricError, match="2 tokens"):
        attribute(model, "hello", answer="de", tokenizer=tok)
    with pytest.raises(ValueError, match="method="):
        attribute(model, "hello", answer="d", tokenizer=tok, method="shap")
    with pytest.raises(ValueError, match="baseline"):
        attribute(model, "hello", answer="d", tokenizer=tok, baseline="mean")


def test_public_name_and_result_helpers() -> None:
    assert nbdebug.attribute is attribute
    model = tiny_lm("gpt2")
    a = attribute(model, torch.arange(6)[None], answer=A, wrong=W, method="integrated_gradients", steps=8)
    assert "integrated_gradients" in repr(a) and "delta" in repr(a)
    top = a.top(2)
    assert len(top) == 2 and top[0][1] >= top[1][1]
    d = a.to_dict()
    assert d["scores"] == [float(s) for s in a.scores] and set(d["curves"]) == {"deletion", "random"}
