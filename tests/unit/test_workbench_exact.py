"""Exact patching (nbdebug.patch, method="exact") equals one full forward per patch with plain hooks,
on random GPT-2, Llama with GQA, GPT-NeoX and TransformerLens models, for every site kind and both
directions; equals transformer_lens.patching on a HookedTransformer; reuses cached state (blocks
before the patch and positions before it are not recomputed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from _workbench_ref import (
    HEAD_DIM,
    HEADS,
    answer_pair,
    hand_grid,
    hooked,
    logit_diff,
    prompts,
    tiny,
)
from _workbench_ref import sites as site_modules

import nbdebug
from nbdebug.workbench import Workbench

FAMILIES = ["gpt2", "llama", "neox", "hooked"]
#: each family's list of blocks, by hand
BLOCKS = {"gpt2": "transformer.h", "llama": "model.layers", "neox": "gpt_neox.layers", "hooked": "blocks"}
_MODELS: dict[str, Any] = {}


def model_of(family: str) -> Any:
    if family not in _MODELS:
        _MODELS[family] = tiny(family)
    return _MODELS[family]


def reference(m: Any, family: str, clean: torch.Tensor, corrupt: torch.Tensor, sites: str, direction: str, positions: Any,
              a: int, w: int) -> np.ndarray:
    """One forward per patch at the modules :data:`_workbench_ref.SITES` names for ``family``."""
    base, src = (corrupt, clean) if direction == "denoise" else (clean, corrupt)
    heads = HEADS if sites == "heads" else 0
    all_positions = positions == "all" or (sites == "heads" and positions is None)
    return hand_grid(m, base, src, site_modules(m, family, sites), logit_diff(a, w),
                     heads=heads, head_dim=HEAD_DIM, z_layout=family == "hooked", all_positions=all_positions)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sites,positions", [("resid", None), ("attn", None), ("mlp", None), ("heads", None),
                                             ("heads", "each"), ("resid", "all")])
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_grid_equals_one_forward_per_patch(family: str, sites: str, positions: Any, direction: str) -> None:
    m = model_of(family)
    clean, corrupt = prompts(changed=(2, 4))
    a, w = answer_pair(m, clean, corrupt)
    g = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites=sites, direction=direction, positions=positions,
                      progress=False)
    ref = reference(m, family, clean, corrupt, sites, direction, positions, a, w)
    assert g.raw.shape == ref.shape == g.effect.shape == g.identical.shape
    m_base = g.metric_corrupt if direction == "denoise" else g.metric_clean
    # identical cells are not run: reported as such, and the loop's patch there changes nothing, so the
    # grid holds the base run's metric there: effect exactly 0 denoising, 1 noising (issue 28)
    np.testing.assert_allclose(ref[g.identical], m_base, atol=1e-5)
    assert (g.raw[g.identical] == m_base).all()
    assert (g.effect[g.identical] == (0.0 if direction == "denoise" else 1.0)).all()
    assert np.isfinite(g.effect).all()
    np.testing.assert_allclose(g.raw[~g.identical], ref[~g.identical], atol=1e-5, rtol=1e-5)
    mc, mk = g.metric_clean, g.metric_corrupt
    np.testing.assert_allclose(g.effect[~g.identical], (ref[~g.identical] - mk) / (mc - mk), atol=1e-4)
    assert g.patches == int((~g.identical).sum())


def test_layout_and_labels() -> None:
    m = model_of("llama")
    clean, corrupt = prompts(changed=(2,))
    a, w = answer_pair(m, clean, corrupt)
    g = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="heads", progress=False)
    assert g.shape == (3, 4) and g.columns == ["h0", "h1", "h2", "h3"]
    assert g.rows == [f"model.layers.{i}.self_attn.o_proj" for i in range(3)] and g.heads == [None] * 3
    g = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="heads", positions=[2, -1], progress=False)
    assert g.shape == (12, 2) and g.rows[5] == "model.layers.1.self_attn.o_proj:h1" and g.layers[5] == 1 and g.heads[5] == 1
    assert g.positions == [(2,), (6,)] and g.columns == [str(int(clean[0, 2])), str(int(clean[0, 6]))]
    g = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="attn", progress=False)
    assert g.rows[0] == "model.layers.0.self_attn" and len(g.columns) == 7
    # causal: positions before the first changed token are identical at every layer; so is the embedding
    # of an unchanged token at block 0's input
    r = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="resid", progress=False)
    assert r.identical[:, :2].all() and r.identical[0, 3:].all() and not r.identical[0, 2] and not r.identical[1:, 2:].any()


def test_equals_transformer_lens_get_act_patch_resid_pre() -> None:
    patching = pytest.importorskip("transformer_lens.patching")
    m = hooked(kv_heads=None, positional="standard")
    clean, corrupt = prompts(changed=(1, 3))
    a, w = answer_pair(m, clean, corrupt)
    _, cache = m.run_with_cache(clean)
    tl = patching.get_act_patch_resid_pre(m, corrupt, cache, lambda lg: logit_diff(a, w)(lg)[0]).numpy()
    g = nbdebug.patch(m, clean, corrupt, answer=a, wrong=w, sites="resid", progress=False)
    raw = np.where(g.identical, g.metric_corrupt, g.raw)
    np.testing.assert_allclose(raw, tl, atol=1e-5)
    assert g.rows == [f"blocks.{i}.hook_resid_pre" for i in range(3)]


@pytest.mark.parametrize("family", ["llama", "gpt2", "hooked"])
def test_patches_start_from_cached_state(family: str) -> None:
    """Patched runs call block l onwards only, on positions p.. only (a global module pre-hook sees what
    nbdebug's own pass runs: the user's module hooks are set aside, global ones are not)."""
    m = model_of(family)
    clean, corrupt = prompts(changed=(3,))
    a, w = answer_pair(m, clean, corrupt)
    wb = Workbench(m, clean, corrupt, answer=a, wrong=w)
    wb.state("clean"), wb.state("corrupt")
    assert wb.runner.kv_reuse, wb.runner.note
    blocks = {id(b): i for i, b in enumerate(m.get_submodule(BLOCKS[family]))}
    seen: list[tuple[int, int, int]] = []

    def spy(mod: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if id(mod) in blocks and args:
            seen.append((blocks[id(mod)], int(args[0].shape[0]), int(args[0].shape[1])))

    h = torch.nn.modules.module.register_module_forward_pre_hook(spy)
    try:
        g = wb.grid("resid", positions=[5], progress=False)
    finally:
        h.remove()
    # block 0's input at position 5 is the same token's embedding in both prompts: not run. Layers 1 and
    # 2: one chunk; block j runs the runs started at or before it, on positions 5 and 6 only
    assert g.identical[:, 0].tolist() == [True, False, False]
    assert seen == [(1, 1, 2), (2, 2, 2)]
    assert g.patches == 2


def test_kv_reuse_off_gives_the_same_grid() -> None:
    m = model_of("llama")
    clean, corrupt = prompts(changed=(2, 5))
    a, w = answer_pair(m, clean, corrupt)
    wb = Workbench(m, clean, corrupt, answer=a, wrong=w)
    g1 = wb.grid("heads", positions="each", progress=False)
    wb.runner.kv_reuse = False
    g2 = wb.grid("heads", positions="each", progress=False)
    np.testing.assert_allclose(g1.raw, g2.raw, atol=1e-5)


def test_small_budget_chunks_give_the_same_grid() -> None:
    m = model_of("gpt2")
    clean, corrupt = prompts(changed=(1,))
    a, w = answer_pair(m, clean, corrupt)
    wb = Workbench(m, clean, corrupt, answer=a, wrong=w)
    eng = wb.engine("denoise", "heads", max_bytes=1)
    lay_cells = __import__("nbdebug.workbench.sites", fromlist=["layout"]).layout(
        wb.pp, "heads", "each", 7, [str(i) for i in range(7)]).cells
    assert all(len(c.cells) == 1 for c in eng.plan(lay_cells))
    g1 = wb.grid("heads", positions="each", max_bytes=1, progress=False)
    g2 = wb.grid("heads", positions="each", progress=False)
    np.testing.assert_allclose(g1.raw, g2.raw, atol=1e-5)


def test_callable_metric_sees_every_position() -> None:
    m = model_of("llama")
    clean, corrupt = prompts(changed=(2,))
    a, _ = answer_pair(m, clean, corrupt)

    def mean_logit(logits: torch.Tensor) -> torch.Tensor:  # reads every position: not only the last
        assert logits.ndim == 3 and logits.shape[1] == 7
        return logits[:, :, a].float().mean(1)

    g = nbdebug.patch(m, clean, corrupt, metric=mean_logit, sites="resid", progress=False)
    ref = hand_grid(m, corrupt, clean, site_modules(m, "llama", "resid"), mean_logit)
    np.testing.assert_allclose(g.raw[~g.identical], ref[~g.identical], atol=1e-5)


def test_log_prob_metric_without_wrong() -> None:
    m = model_of("gpt2")
    clean, corrupt = prompts(changed=(2,))
    a, _ = answer_pair(m, clean, corrupt)
    g = nbdebug.patch(m, clean, corrupt, answer=a, sites="mlp", progress=False)

    def logp(logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits[:, -1].float(), -1)[:, a]

    ref = hand_grid(m, corrupt, clean, site_modules(m, "gpt2", "mlp"), logp)
    np.testing.assert_allclose(g.raw[~g.identical], ref[~g.identical], atol=1e-5)
    assert g.metric.startswith("log p(")


def test_single_cell_for_a_click() -> None:
    """Workbench.cell: the clicked cell's metric equals the grid's, its last-position logits equal a hand
    patched forward's, and its residual column is the base run's before the patched block."""
    m = model_of("llama")
    clean, corrupt = prompts(changed=(2,))
    a, w = answer_pair(m, clean, corrupt)
    wb = Workbench(m, clean, corrupt, answer=a, wrong=w)
    g = wb.grid("resid", progress=False)
    run = wb.cell(g, row=1, col=2)
    assert run.metric == pytest.approx(g.raw[1, 2], abs=1e-5) and run.effect == pytest.approx(g.effect[1, 2], abs=1e-4)
    block = m.model.layers[1]
    src = _record_input(m, clean, block)

    def put(mod: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0].clone()
        x[:, 2] = src[:, 2]
        return (x, *args[1:])

    h = block.register_forward_pre_hook(put)
    try:
        with torch.no_grad():
            out = m(corrupt, output_hidden_states=True)
    finally:
        h.remove()
    np.testing.assert_allclose(run.logits, out.logits[0, -1].numpy(), atol=1e-5)
    assert run.residual.shape == (4, 32)
    np.testing.assert_allclose(run.residual[0], out.hidden_states[0][0, -1].numpy(), atol=1e-6)
    np.testing.assert_allclose(run.residual[2], out.hidden_states[2][0, -1].numpy(), atol=1e-5)
    assert [t for t, _ in run.top(3)] == out.logits[0, -1].topk(3).indices.tolist()


def _record_input(m: Any, ids: torch.Tensor, block: torch.nn.Module) -> torch.Tensor:
    seen: list[torch.Tensor] = []
    h = block.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()))
    try:
        with torch.no_grad():
            m(ids)
    finally:
        h.remove()
    return seen[0]


@pytest.mark.parametrize("name", ["mistral-window-3", "gemma2-window-3", "llama-eager-mqa"])
def test_sliding_windows_and_eager_masks(name: str) -> None:
    """Suffix runs cut the model's own masks (sliding windows shorter than the prompt, eager float masks,
    one key/value head) to the suffix's rows: still equal to one forward per patch."""
    import transformers as T

    torch.manual_seed(0)
    common = dict(num_hidden_layers=3, num_attention_heads=4, hidden_size=32, intermediate_size=64, vocab_size=64)
    m = {"mistral-window-3": lambda: T.MistralForCausalLM(T.MistralConfig(num_key_value_heads=2, sliding_window=3, **common)),
         "gemma2-window-3": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(num_key_value_heads=2, head_dim=8, sliding_window=3, **common)),
         "llama-eager-mqa": lambda: T.LlamaForCausalLM(T.LlamaConfig(num_key_value_heads=1, attn_implementation="eager", **common)),
         }[name]().eval()
    clean, corrupt = prompts(T=8, changed=(1, 4))
    a, w = answer_pair(m, clean, corrupt)
    wb = Workbench(m, clean, corrupt, answer=a, wrong=w)
    for sites in ("resid", "heads"):
        g = wb.grid(sites, positions="each", progress=False)
        assert wb.runner.kv_reuse
        ref = reference(m, name.split("-")[0], clean, corrupt, sites, "denoise", "each", a, w)
        np.testing.assert_allclose(np.where(g.identical, g.metric_corrupt, g.raw), ref, atol=1e-5)
