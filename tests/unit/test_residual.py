"""The residual stream row: per-token RMS norm of each block's output, from the thermometer's stats
(whole run and per step), against the hidden states computed directly."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from nbdebug.capture.history import History
from nbdebug.inspectors.residual import block_rows, residual_history, residual_stream


def rms_norm(h: torch.Tensor) -> float:
    """sqrt(mean over tokens of ‖h_t‖²), by hand (float64)."""
    h = h.detach().double().reshape(-1, h.shape[-1])
    return float(h.norm(dim=-1).pow(2).mean().sqrt())


@dataclass
class Row:
    name: str
    shape: tuple[int, ...]
    stats: dict[str, float] = field(default_factory=dict)


def row_of(name: str, h: torch.Tensor) -> Row:
    """A thermometer row's stats of ``h`` (the fields the inspector reads)."""
    x = h.double()
    fin = torch.isfinite(x)
    return Row(name, tuple(h.shape), {"numel": float(x.numel()), "norm": float(x[fin].norm()), "nan": float(x.isnan().sum()),
                                      "inf": float(x.isinf().sum()), "mean": float(x[fin].mean()), "std": float(x[fin].std())})


def test_whole_run_norm_growth_and_nonfinite_from_rows() -> None:
    torch.manual_seed(0)
    hs = [torch.randn(2, 5, 8) * s for s in (1.0, 3.0, 30.0, 31.0)]
    hs[3][0, 2, 1] = float("nan")
    rows = [row_of("model.layers.0", hs[0]), row_of("model.layers.1[0]", hs[1]), row_of("model.layers.2", hs[2]),
            row_of("model.layers.3", hs[3]), row_of("model.norm", hs[0])]
    blocks = [f"model.layers.{i}" for i in range(5)]
    res = residual_stream(rows, blocks)
    assert res.rows == ["model.layers.0", "model.layers.1[0]", "model.layers.2", "model.layers.3", None] and res.d == 8
    np.testing.assert_allclose(res.norm[:3], [rms_norm(h) for h in hs[:3]], rtol=1e-12)
    assert math.isnan(res.norm[3]) and math.isnan(res.norm[4]) and res.nonfinite.tolist() == [False, False, False, True, False]
    np.testing.assert_allclose(res.growth[1:3], [res.norm[1] / res.norm[0], res.norm[2] / res.norm[1]])
    assert math.isnan(res.growth[0]) and res.largest_jump == 2 and res.first_nonfinite == 3
    assert "1 of 5 blocks" in res.notes[0]


def test_block_rows_prefers_the_block_then_its_first_leaf() -> None:
    assert block_rows(["a.0", "a.0[0]", "a.1[0]", "a.1[1]", "a.2#2"], ["a.0", "a.1", "a.2"]) == ["a.0", "a.1[0]", None]


def test_per_step_history_matches_hand_norms() -> None:
    torch.manual_seed(1)
    steps = [1, 2, 3]
    hs = [[torch.randn(4, 6, 16) * (1 + k) * (1 + 2 * b) + 0.5 * b for b in range(3)] for k in range(3)]  # [step][block]
    names = ["m.layers.0", "m.layers.1", "m.layers.2"]
    stats = {f: [[row_of(n, h).stats[f] for n, h in zip(names, step, strict=True)] for step in hs] for f in ("mean", "std", "nan", "inf", "norm")}
    info = [{"shape": (4, 6, 16)}] * 3
    hist = History.from_arrays(steps, [*names, "m.norm"], {f: np.pad(np.asarray(v), ((0, 0), (0, 1))) for f, v in stats.items()}, row_info=[*info, {}])
    got = residual_history(hist, [*names, "m.layers.3"])
    want = np.array([[rms_norm(h) for h in step] for step in hs])
    np.testing.assert_allclose(got[:, :3], want, rtol=1e-5)  # float32 history
    assert np.isnan(got[:, 3]).all()
    np.testing.assert_allclose(residual_history(hist, names, agg="max"), want, rtol=1e-5)  # one step per bucket
    with pytest.raises(ValueError, match="agg"):
        residual_history(hist, names, agg="min")
    values = {f: np.asarray(v) for f, v in stats.items()}
    small = History.from_arrays(steps, names, values, row_info=info, max_bytes=History.slot_bytes(3) * 2)
    assert len(small.step_index) < 3  # decimated: "max" bounds every step of a bucket, "last" is its last step
    firsts = small.bucket_first
    for k, (first, last) in enumerate(zip(firsts, small.step_index, strict=True)):
        np.testing.assert_allclose(residual_history(small, names)[k], want[last - 1], rtol=1e-5)
        assert (residual_history(small, names, agg="max")[k] >= want[first - 1 : last].max(0) * (1 - 1e-6)).all()


def test_from_a_real_capture_of_a_llama() -> None:
    """Whole run and per step, from a thermometer capture with the blocks among its layers."""
    pytest.importorskip("transformers")
    from nbdebug.adapters.offline import tiny_lm
    from nbdebug.adapters.transformers import find_parts
    from nbdebug.capture.session import Capture

    m = tiny_lm("llama", vocab=100, layers=3)
    blocks = [n for n, _ in find_parts(m).blocks]
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 100, (2, 7), generator=gen) for _ in range(3)]
    with torch.no_grad():  # hidden_states[i + 1] is block i's output (the last one is after the final norm in HF: not compared)
        hidden = [m(ids, output_hidden_states=True).hidden_states[1:-1] for ids in batches]
    with Capture(m, layers=blocks) as cap:
        with torch.no_grad():
            for ids in batches:
                m(ids)
    res = residual_stream(cap.result.layers, blocks)
    whole = [rms_norm(torch.cat([h[i] for h in hidden])) for i in range(2)]  # the whole run: every token of every step
    np.testing.assert_allclose(res.norm[:-1], whole, rtol=1e-5)
    assert np.isfinite(res.norm).all() and res.d == 16
    per_step = residual_history(cap.result.history, blocks)
    np.testing.assert_allclose(per_step[:, :-1], [[rms_norm(x) for x in h] for h in hidden], rtol=1e-4)


def test_thermometer_of_a_transformer_captures_its_blocks_for_the_residual_stream() -> None:
    """By default the thermometer of a transformer captures every leaf AND each block's own output,
    so the residual stream is there without options; it equals the model's own hidden states. Other
    models keep leaves only."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import nbdebug
    from nbdebug.adapters.transformers import find_parts
    from nbdebug.capture.select import select_modules

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=64, max_position_embeddings=32)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 7))
    with nbdebug.debug(model, "thermometer") as dbg:
        out = model(ids, output_hidden_states=True)
    res = dbg.result
    blocks = [n for n, _ in find_parts(model).blocks]
    modules = {r.name.split("[")[0] for r in res.layers}  # "model.rotary_emb[0]": a tuple output's leaf
    assert set(blocks) <= modules
    assert {n for n, _ in select_modules(model, None)} <= modules  # every leaf is still a row
    stream = residual_stream(res.layers, blocks)
    # hidden_states[i + 1] is block i's output (the last one is after the final norm in transformers)
    np.testing.assert_allclose(stream.norm[:-1], [rms_norm(h) for h in out.hidden_states[1:-1]], rtol=1e-4)

    cnn = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU())
    with nbdebug.debug(cnn, "thermometer") as dbg:
        cnn(torch.randn(1, 1, 5, 5))
    assert [r.name for r in dbg.result.layers] == ["0", "1"]
