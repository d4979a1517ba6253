"""Views on a model spread by accelerate's ``device_map`` over the CPU and disk (weights on ``meta``
until accelerate's hooks load them): the logit lens equals the lens of the same checkpoint loaded
without offload and the hand computation; the other views match too; accelerate's hooks stay, ours
go, nothing stays materialised, the model's outputs are unchanged."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import nbdebug
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.capture.state import execution_device, loaded_weights, offloaded
from nbdebug.inspectors.logitlens import LogitLens, lens_stats
from nbdebug.recorders.logitlens import LogitLensRecorder
from nbdebug.testing import offload_map, offloaded_llama

K = 5
V = 512


@pytest.fixture(scope="module", params=[("map", False), ("map", True), ("max_memory", False)],
                ids=["map", "map-tied", "max-memory"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    split, tied = request.param
    return offloaded_llama(tmp_path_factory.mktemp("offload"), tied=tied, split=split)


@pytest.fixture(scope="module")
def untied(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    return offloaded_llama(tmp_path_factory.mktemp("offload1"))


def ids_of(T: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, V, (1, T), generator=torch.Generator().manual_seed(seed))


def state(m: torch.nn.Module) -> dict[str, Any]:
    """What the cell must leave as it was: accelerate's map and hooks (the same objects), where every
    weight lives, our hook count; and the fingerprint (offloaded weights through accelerate's stored copy).

    Take it after one forward: accelerate's first forward unties a tied offloaded weight (a second
    ``lm_head.weight`` in ``named_parameters()``), with or without nbdebug."""
    return {
        "map": dict(m.hf_device_map),
        "accelerate_hooks": {n: id(mod._hf_hook) for n, mod in m.named_modules() if hasattr(mod, "_hf_hook")},
        "devices": {n: p.device.type for n, p in m.named_parameters()},
        "hooks": hook_count(m),
        "fingerprint": fingerprint(m),
    }


def same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert {k: v for k, v in a.items() if k != "fingerprint"} == {k: v for k, v in b.items() if k != "fingerprint"}
    assert same_fingerprint(a["fingerprint"], b["fingerprint"]) == []


def hand_lens(ref: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """(rows, T, V) log-probabilities of the model loaded without offload: hidden state → model.norm → lm_head."""
    with torch.no_grad():
        out = ref(ids, output_hidden_states=True)
        rows = [ref.lm_head(ref.model.norm(h[0])) for h in out.hidden_states[:-1]] + [out.logits[0]]
    return torch.log_softmax(torch.stack(rows).float(), -1)


def lens_of(m: torch.nn.Module, ids: torch.Tensor, **options: Any) -> Any:
    with LogitLensRecorder(m, lens_topk=K, **options) as rec:
        with torch.no_grad():
            m(ids)
    return rec


def test_helper_spreads_the_model_over_cpu_and_disk(pair: tuple[Any, Any]) -> None:
    m, ref = pair
    assert set(m.hf_device_map.values()) == {"cpu", "disk"}
    assert m.lm_head.weight.device.type == "meta" and offloaded(m.lm_head)
    assert m.model.layers[-1].mlp.up_proj.weight.device.type == "meta"
    assert not hasattr(ref, "hf_device_map") and ref.lm_head.weight.device.type == "cpu"
    assert execution_device(m.lm_head) == torch.device("cpu")
    ids = ids_of()
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, ref(ids).logits, rtol=0, atol=1e-6)


def test_offload_map_names_every_module_once() -> None:
    dm = offload_map(4, tied=True)
    assert dm["model.embed_tokens"] == "disk" == dm["lm_head"] and dm["model.layers.1"] == "cpu" and dm["model.layers.2"] == "disk"


def test_reading_the_unembedding_directly_fails(untied: tuple[Any, Any]) -> None:
    """Today's failure: the unembedding read as a tensor is on ``meta`` (accelerate loads it only
    inside its hook); read through ``loaded_weights`` it is there, and back on ``meta`` afterwards."""
    m, ref = untied
    x = torch.randn(2, 3, 64)
    with pytest.raises((RuntimeError, NotImplementedError)):
        lens_stats(x, m.lm_head.weight, k=3)
    lens = LogitLens([torch.randn(3, 64)] * 2, lambda h: h, lambda: m.lm_head.weight)
    with pytest.raises(RuntimeError, match="meta device"):
        lens.columns([0])
    with loaded_weights(m.lm_head):
        torch.testing.assert_close(m.lm_head.weight, ref.lm_head.weight, rtol=0, atol=0)
    assert m.lm_head.weight.device.type == "meta"


def test_model_parts_logits_load_the_offloaded_head(untied: tuple[Any, Any]) -> None:
    from nbdebug.adapters.transformers import find_parts

    m, ref = untied
    h = torch.randn(3, 64)
    with torch.no_grad():
        torch.testing.assert_close(find_parts(m).logits(h), ref.lm_head(h), rtol=0, atol=1e-6)
    assert m.lm_head.weight.device.type == "meta"


def test_lens_on_offloaded_model_equals_reference_and_hand_lens(pair: tuple[Any, Any]) -> None:
    m, ref = pair
    ids = ids_of()
    with torch.no_grad():
        logits_before = m(ids).logits
    before = state(m)
    rec = lens_of(m, ids)
    res = rec.result()  # every column: the unembedding loaded through accelerate's hook, once
    want = lens_of(ref, ids).result()
    for key in ("top_ids", "target_rank"):
        np.testing.assert_array_equal(getattr(res, key), getattr(want, key), err_msg=key)
    for key in ("top_probs", "entropy", "kl", "target_prob"):
        np.testing.assert_allclose(getattr(res, key), getattr(want, key), atol=1e-5, err_msg=key)
    ref_lp = hand_lens(ref, ids)  # every layer, by hand on the model without offload
    top_p, top_i = ref_lp.exp().topk(K, -1)
    np.testing.assert_array_equal(res.top_ids, top_i.numpy())
    np.testing.assert_allclose(res.top_probs, top_p.numpy(), atol=1e-5)
    assert res.top_ids.shape == (5, 9, K) and "top-1 matches" in res.check
    assert "`lm_head` is offloaded by accelerate (" in " ".join(res.notes)
    ids_c, probs_c = rec.lens().cell(2, 4, k=7)  # the widget's on-demand cell
    np.testing.assert_array_equal(ids_c, ref_lp[2, 4].topk(7).indices.numpy())
    np.testing.assert_allclose(probs_c, ref_lp[2, 4].exp().topk(7).values.numpy(), atol=1e-5)
    same_state(before, state(m))  # accelerate's hooks and map kept, ours gone, every offloaded weight back on meta
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, logits_before, rtol=0, atol=0)


def test_the_offloaded_head_is_loaded_once_per_request(untied: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import nbdebug.sessions.lens as weak  # the lens view's weak parts load the head there

    m, _ = untied
    loads: list[str] = []

    def counting(module: torch.nn.Module) -> Any:
        loads.append(type(module).__name__)
        return loaded_weights(module)

    monkeypatch.setattr(weak, "loaded_weights", counting)
    rec = lens_of(m, ids_of())
    lens = rec.lens()  # the model's own top-1 at the last position, then that column: one load
    assert loads == ["Linear"] and lens.done.sum() == 1
    assert rec.result().top_ids.shape == (5, 9, K)  # the other columns: one request, one load
    lens.cell(0, 0)
    assert loads == ["Linear"] * 3 and m.lm_head.weight.device.type == "meta"


def test_lens_after_generate_on_offloaded_model(untied: tuple[Any, Any]) -> None:
    m, ref = untied
    ids = ids_of(5, seed=3)
    before = state(m)
    out = {}
    for name, model in (("off", m), ("ref", ref)):
        with LogitLensRecorder(model, lens_topk=K) as rec:
            with torch.no_grad():
                seq = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
        out[name] = (seq, rec.result())
    assert torch.equal(out["off"][0], out["ref"][0]) and out["off"][1].top_ids.shape[1] == 8
    np.testing.assert_array_equal(out["off"][1].top_ids, out["ref"][1].top_ids)
    np.testing.assert_allclose(out["off"][1].top_probs, out["ref"][1].top_probs, atol=1e-5)
    same_state(before, state(m))  # the forward on the final sequence too: nothing left loaded


def test_cell_on_offloaded_model_converts_one_vocabulary_chunk_at_a_time(tmp_path: Any) -> None:
    """bfloat16 weights: accelerate loads the unembedding as it is stored; only chunks become float32."""
    from torch.utils._python_dispatch import TorchDispatchMode

    m, ref = offloaded_llama(tmp_path, dtype=torch.bfloat16)
    lens = lens_of(m, ids_of()).lens()
    lens.chunk = 128
    d = 64

    class Biggest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                    Biggest.largest = max(Biggest.largest, t.numel())
            return out

    with Biggest():
        ids_c, _ = lens.cell(1, 3, k=4)
    assert 0 < Biggest.largest < V * d // 2
    assert ids_c.tolist() == lens_of(ref, ids_of()).lens().cell(1, 3, k=4)[0].tolist()


def test_residual_rows_on_their_own_devices_equal_one_stacked_tensor() -> None:
    """A list of per-row residuals (each where its block ran) gives the table of the stacked tensor."""
    torch.manual_seed(0)
    resid = torch.randn(4, 6, 16)
    w = torch.randn(100, 16)
    norm = torch.nn.LayerNorm(16)
    a = LogitLens(resid, norm, w, k=3, position_block=2).result()
    b = LogitLens(list(resid), norm, w, k=3, position_block=4, device=torch.device("cpu")).result()
    np.testing.assert_array_equal(a.top_ids, b.top_ids)
    np.testing.assert_allclose(a.kl, b.kl, atol=1e-6)


def test_thermometer_on_offloaded_model_equals_reference(untied: tuple[Any, Any]) -> None:
    m, ref = untied
    ids = ids_of()
    before = state(m)
    results = {}
    for name, model in (("off", m), ("ref", ref)):
        with nbdebug.debug(model, view="thermometer") as dbg:
            with torch.no_grad():
                model(ids)
        results[name] = dbg.result
    a, b = results["off"], results["ref"]
    assert [r.name for r in a.layers] == [r.name for r in b.layers] and len(a.layers) > 30
    for ra, rb in zip(a.layers, b.layers, strict=True):
        assert ra.stats.keys() == rb.stats.keys()
        np.testing.assert_allclose([ra.stats[k] for k in ra.stats], [rb.stats[k] for k in ra.stats], rtol=1e-5, atol=1e-6, err_msg=ra.name)
    same_state(before, state(m))


def test_attention_on_offloaded_model_equals_reference_also_recomputed(untied: tuple[Any, Any]) -> None:
    m, ref = untied
    ids = ids_of()
    before = state(m)
    results = {}
    for name, model in (("off", m), ("ref", ref)):
        with nbdebug.debug(model, view="attention", max_bytes=1000) as dbg:  # nothing kept: heads recomputed by a forward
            with torch.no_grad():
                model(ids)
        results[name] = dbg.result
    a, b = results["off"], results["ref"]
    for key in a.metrics:
        np.testing.assert_allclose(a.metrics[key], b.metrics[key], atol=1e-6, err_msg=key)
    np.testing.assert_allclose(a.head(3, 1), b.head(3, 1), atol=1e-6)  # a forward stopped inside a disk-offloaded block
    same_state(before, state(m))


def test_every_view_on_offloaded_model_shows_or_says_why(untied: tuple[Any, Any]) -> None:
    m, _ = untied
    ids = ids_of()
    with torch.no_grad():
        logits_before = m(ids).logits
    before = state(m)
    with nbdebug.debug(m, view="all") as dbg:
        with torch.no_grad():
            m(ids)
    widgets = dbg.widgets()
    assert {"thermometer", "attention", "logitlens"} <= set(dbg.results), dbg.skipped
    assert len(widgets) == len(dbg.views)
    for view, why in dbg.skipped.items():  # vision views: a one-line reason, never an exception's text
        assert view in ("featuremaps", "gradcam") and "Error" not in why and "\n" not in why
    same_state(before, state(m))
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, logits_before, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_lens_with_blocks_on_cpu_and_gpu(tmp_path: Any) -> None:  # pragma: no cover - no GPU here
    import transformers as T

    _, ref = offloaded_llama(tmp_path)
    path = next(p for p in tmp_path.iterdir() if p.is_dir())
    dm = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu",
          "model.layers.2": 0, "model.layers.3": 0, "model.norm": 0, "lm_head": "cpu"}
    m = T.AutoModelForCausalLM.from_pretrained(path, device_map=dm).eval()
    ids = ids_of()
    res, want = lens_of(m, ids).result(), lens_of(ref, ids).result()
    np.testing.assert_array_equal(res.top_ids, want.top_ids)
    np.testing.assert_allclose(res.top_probs, want.top_probs, atol=1e-4)


def test_magic_view_all_on_offloaded_model(shell: Any, untied: tuple[Any, Any]) -> None:
    """``%%nndebug model --view logitlens -o`` (equal to the reference) and ``--view all`` on the offloaded model."""
    from nbdebug.inspectors.logitlens import LensResult

    m, ref = untied
    ids = ids_of()
    shell.user_ns.update(model=m, ids=ids, torch=torch)
    assert shell.run_cell("with torch.no_grad(): model(ids)").success  # after one forward: the state to keep
    before = state(m)
    res = shell.run_cell(f"%%nndebug model --view logitlens --lens-topk {K} -o lens\nwith torch.no_grad():\n    out = model(ids)")
    assert res.success and res.error_in_exec is None
    lens = shell.user_ns["lens"]
    assert isinstance(lens, LensResult)
    np.testing.assert_array_equal(lens.top_ids, lens_of(ref, ids).result().top_ids)
    res = shell.run_cell("%%nndebug model --view all\nwith torch.no_grad():\n    out = model(ids)")
    assert res.success and any("application/vnd.jupyter.widget-view+json" in d for d in shell.displayed)
    with torch.no_grad():
        torch.testing.assert_close(shell.user_ns["out"].logits, ref(ids).logits, rtol=0, atol=1e-6)
    same_state(before, state(m))
