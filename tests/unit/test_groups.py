"""Grouping thermometer rows by the module tree (nbdebug/inspectors/groups.py): exact groups for
GPT-2, Llama and BERT naming, nested repeats, flat models, shared modules; strip values, flags
upward, residual stream, filter, and the compact payload (names rebuilt from the tree)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from nbdebug.inspectors.groups import (
    ROW_FIELDS,
    STRIP_STATS,
    group_rows,
    groups_payload,
    match,
    split_module,
)
from nbdebug.inspectors.residual import residual_stream
from nbdebug.inspectors.thermometer import COLUMNS

LLAMA_BLOCK = ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "post_attention_layernorm", "mlp.gate_proj", "mlp.act_fn", "mlp.up_proj", "mlp.down_proj"]
GPT2_BLOCK = ["ln_1", "attn.c_attn", "attn.c_proj", "attn.resid_dropout", "ln_2", "mlp.c_fc", "mlp.act", "mlp.c_proj",
              "mlp.dropout"]
BERT_BLOCK = ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
              "attention.output.dropout", "attention.output.LayerNorm", "intermediate.dense",
              "intermediate.intermediate_act_fn", "output.dense", "output.dropout", "output.LayerNorm"]


def llama_names(blocks: int) -> list[str]:
    """Row names of a Llama-style capture (what Capture gives on tiny_lm('llama'), checked by hand)."""
    names = ["model.embed_tokens", "model.rotary_emb[0]", "model.rotary_emb[1]"]
    for i in range(blocks):
        names += [f"model.layers.{i}.{p}" for p in LLAMA_BLOCK]
    return [*names, "model.norm", "lm_head"]


def items(tree, its):
    """Items as readable names: rows by name, groups as ('group', container)."""
    return [tree.names[i] if kind == "row" else ("group", tree.groups[i].name) for kind, i in its]


def test_llama_one_group_per_container_with_blocks_in_order():
    names = llama_names(3)
    t = group_rows(names)
    assert [g.name for g in t.groups] == ["model.layers"]
    g = t.groups[0]
    assert [t.blocks[b].name for b in g.blocks] == ["model.layers.0", "model.layers.1", "model.layers.2"]
    assert [t.blocks[b].index for b in g.blocks] == [0, 1, 2]
    assert items(t, t.top) == ["model.embed_tokens", "model.rotary_emb[0]", "model.rotary_emb[1]",
                               ("group", "model.layers"), "model.norm", "lm_head"]
    b1 = t.blocks[g.blocks[1]]
    assert items(t, b1.items) == [f"model.layers.1.{p}" for p in LLAMA_BLOCK]
    assert b1.rows == list(range(13, 23))
    assert g.first == 3 and g.parent == -1
    assert t.owner.tolist() == [-1] * 3 + [0] * 10 + [1] * 10 + [2] * 10 + [-1, -1]


def test_gpt2_and_bert_naming():
    gpt2 = ["transformer.wte", "transformer.wpe", "transformer.drop"]
    gpt2 += [f"transformer.h.{i}.{p}" for i in range(2) for p in GPT2_BLOCK] + ["transformer.ln_f", "lm_head"]
    t = group_rows(gpt2)
    assert [(g.name, [t.blocks[b].name for b in g.blocks]) for g in t.groups] == [
        ("transformer.h", ["transformer.h.0", "transformer.h.1"])]
    assert items(t, t.top) == ["transformer.wte", "transformer.wpe", "transformer.drop", ("group", "transformer.h"),
                               "transformer.ln_f", "lm_head"]
    bert = ["embeddings.word_embeddings", "embeddings.LayerNorm"]
    bert += [f"encoder.layer.{i}.{p}" for i in range(3) for p in BERT_BLOCK] + ["pooler.dense", "pooler.activation"]
    t = group_rows(bert)
    assert [g.name for g in t.groups] == ["encoder.layer"]
    assert [len(t.blocks[b].rows) for b in t.groups[0].blocks] == [11, 11, 11]
    assert items(t, t.top) == [*bert[:2], ("group", "encoder.layer"), *bert[-2:]]


def test_nested_repeats_and_block_outputs():
    # blocks.N holds experts.M (a MoE) and its own output row blocks.N[0]; a top-level `blocks`-free head
    names = []
    for i in range(2):
        names += [f"blocks.{i}.norm"] + [f"blocks.{i}.moe.experts.{e}.{p}" for e in range(3) for p in ("w1", "w2")]
        names += [f"blocks.{i}.moe.gate", f"blocks.{i}[0]", f"blocks.{i}[1]"]
    names += ["head"]
    t = group_rows(names)
    assert [(g.name, g.parent) for g in t.groups] == [("blocks", -1), ("blocks.0.moe.experts", 0), ("blocks.1.moe.experts", 4)]
    assert [b.name for b in t.blocks] == ["blocks.0", "blocks.0.moe.experts.0", "blocks.0.moe.experts.1",
                                          "blocks.0.moe.experts.2", "blocks.1", "blocks.1.moe.experts.0",
                                          "blocks.1.moe.experts.1", "blocks.1.moe.experts.2"]
    assert items(t, t.top) == [("group", "blocks"), "head"]
    assert items(t, t.blocks[0].items) == ["blocks.0.norm", ("group", "blocks.0.moe.experts"), "blocks.0.moe.gate",
                                           "blocks.0[0]", "blocks.0[1]"]
    assert items(t, t.blocks[2].items) == ["blocks.0.moe.experts.1.w1", "blocks.0.moe.experts.1.w2"]
    # a block's rows include its nested groups' rows
    assert len(t.blocks[0].rows) == 10 and t.blocks[4].rows == list(range(10, 20))
    assert t.owner[names.index("blocks.0[0]")] == 0 and t.owner[names.index("blocks.1.moe.experts.2.w2")] == 7


def test_flat_model_unchanged_and_sequential_leaves_not_grouped():
    names = ["conv1", "relu", "conv2", "relu#2", "pool", "fc"]
    t = group_rows(names, modules=["conv1", "relu", "conv2", "relu", "pool", "fc"])
    assert t.groups == [] and t.blocks == []
    assert items(t, t.top) == names
    # nn.Sequential: numeric names that are leaves (Conv, ReLU, Conv, ReLU) are rows, not blocks
    seq = ["0", "1", "2", "3", "4"]
    t = group_rows(seq)
    assert t.groups == [] and items(t, t.top) == seq
    # unicode digits are names, not indices
    t = group_rows(["m.\u00b2.a", "m.\u00b3.a", "m.\u0661.a", "m.\u0662.a"])
    assert t.groups == []
    # ResNet: layer1.0 / layer1.1 are blocks with members
    res = ["conv1", "layer1.0.conv1", "layer1.0.relu", "layer1.0.relu#2", "layer1.1.conv1", "layer1.1.relu", "fc"]
    t = group_rows(res)
    assert [g.name for g in t.groups] == ["layer1"]
    assert items(t, t.blocks[0].items) == ["layer1.0.conv1", "layer1.0.relu", "layer1.0.relu#2"]


def test_shared_module_calls_and_leaf_names():
    assert split_module("relu#2") == ("relu", "#2")
    assert split_module("block.0[1]#3") == ("block.0", "[1]#3")
    assert split_module("model.layers.0.self_attn.q_proj") == ("model.layers.0.self_attn.q_proj", "")
    # a ReLU shared by two blocks: its calls stay rows of the module `act` at the top level, in order
    names = ["layers.0.fc", "act", "layers.1.fc", "act#2", "out[0]"]
    t = group_rows(names, modules=["layers.0.fc", "act", "layers.1.fc", "act", "out"])
    assert items(t, t.top) == [("group", "layers"), "act", "act#2", "out[0]"]
    assert t.modules == ["layers.0.fc", "act", "layers.1.fc", "act", "out"]


def table_for(values: dict[str, list[float]], n: int) -> np.ndarray:
    t = np.full((n, len(COLUMNS)), np.nan)
    for col, v in values.items():
        t[:, COLUMNS.index(col)] = v
    return t


def test_strip_stats_and_flags_upward():
    names = ["emb", "h.0.a", "h.0.b", "h.1.a", "h.1.b", "out"]
    table = table_for({"std": [9, 1, 3, 2, np.nan, 9], "min": [0, -5, 0, -1, -2, 0], "max": [0, 4, 7, 1, 1, 0],
                       "grad_norm": [9, 3, 4, np.nan, np.nan, 9], "zero_frac": [0, 0.5, 0.25, 1, 1, 0],
                       "nan": [0, 0, 2, 0, 0, 0], "inf": [0, 1, np.nan, 0, 0, 0]}, 6)
    flags = [[], ["vanishing"], ["nonfinite", "dead"], ["dead"], [], ["exploding"]]
    t = group_rows(names, types=["E", "L", "L", "L", "L", "L"], table=table, columns=COLUMNS, flags=flags)
    S = {s: i for i, s in enumerate(STRIP_STATS)}
    s0, s1 = t.strip
    assert s0[S["severity"]] == 3 and s1[S["severity"]] == 2
    assert s0[S["std"]] == 2.0 and s1[S["std"]] == 2.0
    assert s0[S["absmax"]] == 7 and s1[S["absmax"]] == 2
    assert s0[S["grad_norm"]] == 5.0 and math.isnan(s1[S["grad_norm"]])
    assert s0[S["zero_frac"]] == 0.375 and s1[S["zero_frac"]] == 1.0
    assert s0[S["nonfinite"]] == 3 and s1[S["nonfinite"]] == 0
    assert math.isnan(s0[S["residual"]])
    assert t.flag_codes == ["vanishing", "nonfinite", "dead", "exploding"]
    assert t.row_flags_of(2) == ["nonfinite", "dead"]
    assert [t.blocks[0].flags, t.blocks[1].flags, t.groups[0].flags] == [0b111, 0b100, 0b111]
    assert t.values[1, ROW_FIELDS.index("std")] == 1 and t.values.dtype == np.float32


def test_filter_by_name_type_flag_inside_groups():
    names = llama_names(4)
    types = ["Linear" if "proj" in n or n == "lm_head" else "Norm" for n in names]
    flags = [["dead"] if n == "model.layers.2.mlp.act_fn" else [] for n in names]
    t = group_rows(names, types=types, flags=flags)
    assert [names[r] for r in match(t, "flag:dead")] == ["model.layers.2.mlp.act_fn"]
    assert [names[r] for r in match(t, "DEAD")] == ["model.layers.2.mlp.act_fn"]
    assert [names[r] for r in match(t, "layers.3. q_proj")] == ["model.layers.3.self_attn.q_proj"]
    assert len(match(t, "type:linear")) == 4 * 7 + 1  # 7 projections per block and lm_head
    assert match(t, "name:linear") == []
    assert match(t, "") == list(range(len(names)))


def test_residual_stream_is_the_groups_strip():
    blocks = [f"model.layers.{i}" for i in range(3)]
    names = llama_names(3)
    # the blocks' own outputs captured as rows (tuple outputs: [0] is the hidden state)
    rows = [SimpleNamespace(name=f"{b}[0]", shape=(1, 4, 8), stats={"norm": 2.0 * (i + 1) * math.sqrt(4), "numel": 32})
            for i, b in enumerate(blocks)]
    res = residual_stream(rows, blocks)
    assert res.norm.tolist() == [2.0, 4.0, 6.0]
    allnames = names + [r.name for r in rows]
    t = group_rows(allnames, residual=res)
    col = STRIP_STATS.index("residual")
    assert t.strip[:, col].tolist() == [2.0, 4.0, 6.0]
    assert t.residual["group"] == 0 and t.residual["d"] == 8 and t.residual["largest_jump"] == "model.layers.1"
    meta, arrays = groups_payload(t)
    assert meta["residual"]["largest_jump"] == "model.layers.1"
    np.testing.assert_allclose(arrays["residual_growth"], [np.nan, 2.0, 1.5])
    # blocks that are not grouped: a note, no residual
    t = group_rows(["a", "b"], residual=res)
    assert t.residual is None and "not among" in t.notes[0]


def full_names(meta: dict, arrays: dict) -> list[str]:
    """Rebuild every name node's full name the way groups.ts does."""
    out: list[str] = []
    for p, s in zip(arrays["name_parent"].tolist(), arrays["name_suffix"].tolist()):
        out.append((out[p] if p >= 0 else "") + meta["strings"][s])
    return out


def test_payload_names_round_trip_and_size_at_1600_rows():
    per = LLAMA_BLOCK + [f"mlp.experts.{e}.w{k}" for e in range(10) for k in range(4)]  # 50 rows per block
    names = [f"model.layers.{i}.{p}" for i in range(32) for p in per]
    assert len(names) == 1600
    rng = np.random.default_rng(0)
    table = rng.normal(size=(1600, len(COLUMNS)))
    flags = [["dead"] if i % 97 == 0 else [] for i in range(1600)]
    types = ["Linear"] * 1600
    t = group_rows(names, types=types, table=table, columns=COLUMNS, flags=flags)
    assert [g.name for g in t.groups][:2] == ["model.layers", "model.layers.0.mlp.experts"]
    meta, arrays = groups_payload(t)
    full = full_names(meta, arrays)
    assert [full[i] for i in arrays["row_name"]] == names
    assert [full[i] for i in arrays["group_name"]] == [g.name for g in t.groups]
    assert [full[i] for i in arrays["block_name"]] == [b.name for b in t.blocks]
    assert [meta["strings"][i] for i in arrays["row_type"][:2]] == ["Linear", "Linear"]
    np.testing.assert_array_equal(arrays["values"], t.values)
    nbytes = len(json.dumps(meta)) + sum(a.nbytes for a in arrays.values())
    assert nbytes <= 1_000_000
    # names as a tree: far smaller than the 1,600 full strings
    assert len(json.dumps(meta["strings"])) < len(json.dumps(names)) / 10
    with pytest.raises(KeyError, match=r"model\.layers"):
        t.group_of("nope")


@pytest.mark.parametrize(("family", "container", "top"), [
    ("llama", "model.layers", ["model.embed_tokens", "model.rotary_emb[0]", "model.rotary_emb[1]", ("group", "model.layers"),
                               "model.norm", "lm_head"]),
    ("gpt2", "transformer.h", ["transformer.wte", "transformer.wpe", "transformer.drop", ("group", "transformer.h"),
                               "transformer.ln_f", "lm_head"]),
    ("bert", "encoder.layer", ["embeddings.word_embeddings", "embeddings.token_type_embeddings",
                               "embeddings.position_embeddings", "embeddings.LayerNorm", "embeddings.dropout",
                               ("group", "encoder.layer"), "pooler.dense", "pooler.activation"]),
])
def test_real_capture_rows_group_by_family(family, container, top):
    """The rows a real capture gives (random-init tiny transformers, 3 blocks) group as expected."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from nbdebug.adapters.offline import tiny_lm
    from nbdebug.capture.session import Capture
    from nbdebug.inspectors.thermometer import diagnose

    model = tiny_lm(family, layers=3)
    with Capture(model) as cap:
        model(torch.randint(0, 64, (1, 5)))
    report = diagnose(cap.result)
    from nbdebug.inspectors.groups import group_report

    t = group_report(report)
    assert [g.name for g in t.groups] == [container]
    assert [t.blocks[b].name for b in t.groups[0].blocks] == [f"{container}.{i}" for i in range(3)]
    assert items(t, t.top) == top
    per = {"llama": LLAMA_BLOCK, "gpt2": GPT2_BLOCK, "bert": BERT_BLOCK}[family]
    assert items(t, t.blocks[2].items) == [f"{container}.2.{p}" for p in per]
    # every row is in exactly one place: the top level or one block's items
    shown = [i for k, i in t.top if k == "row"] + [i for b in t.blocks for k, i in b.items if k == "row"]
    assert sorted(shown) == list(range(len(report.names)))
    # the strip's std is the mean of the block's rows' std, from the report's table
    std = report.table[:, COLUMNS.index("std")]
    b0 = t.blocks[0]
    assert t.strip[0, STRIP_STATS.index("std")] == pytest.approx(np.nanmean(std[b0.rows]), rel=1e-6)


def test_residual_for_reads_the_largest_top_group_block_outputs():
    from nbdebug.inspectors.groups import attach_residual, residual_for

    names = ["emb", *[f"enc.{i}.fc" for i in range(2)], *[f"dec.{i}.fc" for i in range(3)], "dec.0", "dec.1[0]"]
    layers = [SimpleNamespace(name=n, shape=(4, 4), stats={"norm": 6.0, "numel": 16}) for n in names]  # 6 / sqrt(4 tokens)
    t = group_rows(names)
    res = residual_for(t, layers)
    assert res.blocks == ["dec.0", "dec.1", "dec.2"] and res.rows == ["dec.0", "dec.1[0]", None]
    np.testing.assert_allclose(res.norm, [3.0, 3.0, np.nan])
    attach_residual(t, res)
    assert t.residual["group"] == 1
    assert t.strip[t.groups[1].blocks, STRIP_STATS.index("residual")].tolist()[:2] == [3.0, 3.0]
    # the block outputs are rows of their own blocks
    assert items(t, t.blocks[t.groups[1].blocks[0]].items) == ["dec.0.fc", "dec.0"]
    # leaf-only captures: no block outputs, no residual
    assert residual_for(group_rows(names[:-2]), layers[:-2]) is None


def test_groups_view_only_for_many_rows_that_repeat():
    from nbdebug.inspectors.groups import groups_view

    def report(names):
        n = len(names)
        return SimpleNamespace(names=names, modules=[split_module(x)[0] for x in names], types=["Linear"] * n,
                               table=np.zeros((n, len(COLUMNS))), flags=[[] for _ in names])

    many = llama_names(10)  # 105 rows
    assert groups_view(report(llama_names(2))) is None  # 25 rows: the flat table is fine
    assert groups_view(report([f"fc{i}" for i in range(150)])) is None  # nothing repeats
    meta, arrays = groups_view(report(many))
    assert len(arrays["block_name"]) == 10 and meta["residual"] is None
    assert groups_view(report(llama_names(2)), min_rows=0) is not None


def test_group_history_per_block_over_kept_steps():
    from nbdebug.capture.history import FIELD_INDEX, HISTORY_FIELDS, History
    from nbdebug.inspectors.groups import (
        HISTORY_STATS,
        attach_residual,
        group_history,
        groups_view,
        residual_for,
    )

    names = ["h.0.a", "h.0.b", "h.0", "h.1.a", "h.1.b", "h.1"]
    h = History(max_bytes=2**20)
    ids = np.array([h.row_id(n, {"name": n, "module": n, "type": "L", "shape": (4, 2), "dtype": "float32"}) for n in names])
    for step in (1, 2, 3):
        v = np.full((len(names), len(HISTORY_FIELDS)), np.nan, np.float32)
        v[:, FIELD_INDEX["std"]] = [step, 3 * step, 1, 10 * step, 20 * step, 2]
        v[:, FIELD_INDEX["mean"]] = 0.0
        v[:, FIELD_INDEX["nan"]] = v[:, FIELD_INDEX["inf"]] = 0.0
        v[:2, FIELD_INDEX["grad_norm"]] = [3.0 * step, 4.0 * step]  # block 1: no gradients
        h.append(step, ids, v, {"loss": 1.0})
    layers = [SimpleNamespace(name=n, shape=(4, 2), stats={"norm": 4.0, "numel": 8}) for n in names]
    t = group_rows(names)
    attach_residual(t, residual_for(t, layers))
    steps, blocks, hs = group_history(h, t)
    assert steps.tolist() == [1, 2, 3] and blocks.tolist() == [0, 1] and hs.shape == (3, 2, len(HISTORY_STATS))
    S = {s: i for i, s in enumerate(HISTORY_STATS)}
    np.testing.assert_allclose(hs[:, 0, S["std"]], [(1 + 3 + 1) / 3, (2 + 6 + 1) / 3, (3 + 9 + 1) / 3], rtol=1e-6)
    np.testing.assert_allclose(hs[:, 0, S["grad_norm"]], [5, 10, 15], rtol=1e-6)
    assert np.isnan(hs[:, 1, S["grad_norm"]]).all()
    # residual: sqrt(d * ((n-1)/n * std^2 + mean^2)) of the block outputs (d = 2, n = 8)
    np.testing.assert_allclose(hs[:, :, S["residual"]], [[math.sqrt(2 * 7 / 8), math.sqrt(2 * 7 / 8 * 4)]] * 3, rtol=1e-6)
    # at most max_slots kept steps, the last one kept
    steps, _, _ = group_history(h, t, max_slots=2)
    assert steps.tolist() == [1, 3]
    steps, _, _ = group_history(h, t, max_bytes=0)  # never fewer than 2 kept steps
    assert steps.tolist() == [1, 3]
    report = SimpleNamespace(names=names, modules=names, types=["L"] * 6, table=np.zeros((6, len(COLUMNS))), flags=[[]] * 6)
    report.step = 3
    meta, arrays = groups_view(report, layers, min_rows=0, history=h)
    assert meta["hist_stats"] == list(HISTORY_STATS) and arrays["hist_strip"].shape == (3, 2, 3)
    assert meta["step"] == 3


def test_thermometer_widget_syncs_the_grouped_view():
    """The thermometer widget carries groups_view's payload (binary arrays) for a model that repeats
    blocks, with the residual stream when the blocks' outputs were captured; {} for a small model."""
    torch = pytest.importorskip("torch")
    from nbdebug.capture.session import Capture
    from nbdebug.widgets.thermometer import ThermometerWidget

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(10)]) for _ in range(12))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), *blocks)
    layers = [n for n, m in model.named_modules() if n and not list(m.children())] + [str(i) for i in range(1, 13)]
    with Capture(model, layers=layers) as cap:
        model(torch.randn(3, 4)).sum().backward()
    w = ThermometerWidget.from_capture(cap.result)
    g = w.groups
    assert len(w.layers) == 1 + 12 * 10 + 12
    assert g["block_name"]["shape"] == [12] and g["values"]["dtype"] == "float32"
    assert isinstance(g["values"]["view"], memoryview)
    assert g["residual"]["group"] == 0 and g["residual"]["d"] == 4
    arr = {k: np.frombuffer(g[k]["view"], np.int32) for k in ("name_parent", "name_suffix", "group_name", "block_name")}
    full = full_names(g, arr)
    # the blocks' container is the model itself (nn.Sequential "1" … "12")
    assert full[arr["group_name"][0]] == "" and [full[i] for i in arr["block_name"]] == [str(i) for i in range(1, 13)]
    small = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with Capture(small) as cap:
        small(torch.randn(3, 4))
    assert ThermometerWidget.from_capture(cap.result).groups == {}


def test_payload_severity_covers_every_flag_a_step_can_carry():
    """The browser re-aggregates the strips at the slider's step, whose flags may be any of the
    history's FLAG_BITS (not only the codes of the payload's own step): each has its severity."""
    from nbdebug.inspectors.groups import SEVERITY
    from nbdebug.inspectors.history import FLAG_BITS

    t = group_rows(["h.0.a", "h.1.a", "x"], flags=[["dead"], [], ["made_up"]])
    meta, _ = groups_payload(t)
    assert meta["flag_codes"] == ["dead", "made_up"]
    assert set(FLAG_BITS) <= set(meta["severity"])
    assert meta["severity"] == {**SEVERITY, "made_up": 1}
    assert all(meta["severity"][c] == SEVERITY.get(c, 1) for c in FLAG_BITS)


def test_widget_history_holds_every_grouped_row_for_the_slider():
    """What the grouped view re-aggregates at step k comes from the thermometer's history trait:
    every grouped row (the blocks' own outputs included: the residual stream) is a history row
    with its shape, and its values at slot k are the kernel's ``result.at(k)``."""
    pytest.importorskip("torch")
    import pathlib
    import sys

    bench = str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    from bench_groups import capture_report

    from nbdebug.widgets._transport import decode_array
    from nbdebug.widgets.thermometer import ThermometerWidget

    result, report = capture_report(blocks=3, steps=3)  # 153 rows: grouped from 100 on
    w = ThermometerWidget(report, result)
    try:
        g, h = w.groups, w.history
        assert g["group_name"] and g["hist_stats"] == ["std", "grad_norm", "residual"]
        rows = [r["name"] for r in h["rows"]]
        assert set(report.names) <= set(rows)
        assert all(f"model.layers.{i}" in rows for i in range(3))
        assert all(r["shape"] for r in h["rows"])
        steps = decode_array(h["steps"]).tolist()
        assert steps == [1, 2, 3]
        last = decode_array(h["last"])
        at2 = {r.name: r for r in result.at(2)}
        j = h["fields"].index("std")
        for name in ("model.layers.1.self_attn.q_proj", "model.layers.2"):
            assert last[1, rows.index(name), j] == pytest.approx(at2[name].stats["std"], rel=1e-6)
    finally:
        w.close()


def _llama_row_info(blocks: int) -> list[dict]:
    """A Llama capture's history rows (leaves and each block's own output), as History.row_info."""
    names = llama_names(blocks)
    info = [{"name": n, "module": n, "type": "Linear" if "proj" in n else "", "shape": (1, 5, 16), "dtype": "float32"}
            for n in names]
    at = names.index("model.norm")
    return info[:at] + [{"name": f"model.layers.{i}", "module": f"model.layers.{i}", "type": "LlamaDecoderLayer",
                         "shape": (1, 5, 16), "dtype": "float32"} for i in range(blocks)] + info[at:]


def test_groups_live_is_the_tree_without_values():
    """While the cell runs the grouped view gets the tree of the history's rows (values, flags and
    strips come from the history in the browser): the same groups and blocks as the final payload,
    NaN values, the residual stream's group and hidden size; None when too few rows or no repeats."""
    from nbdebug.inspectors.groups import groups_live

    info = _llama_row_info(3)
    meta, arrays = groups_live(info, min_rows=10)
    assert meta["live"] is True and meta["step"] is None and meta["flag_codes"] == []
    full = full_names(meta, arrays)
    assert [full[i] for i in arrays["group_name"]] == ["model.layers"]
    assert [full[i] for i in arrays["block_name"]] == [f"model.layers.{i}" for i in range(3)]
    assert arrays["block_rows"].tolist() == [11, 11, 11]  # 10 leaves and the block's own output
    assert [full[i] for i in arrays["row_name"]] == [r["name"] for r in info]
    S = [STRIP_STATS.index(s) for s in ("std", "absmax", "grad_norm", "zero_frac", "residual")]
    assert np.isnan(arrays["values"]).all() and np.isnan(arrays["strip"][:, S]).all()
    assert meta["residual"] == {"group": 0, "d": 16, "largest_jump": None, "first_nonfinite": None, "notes": []}
    assert np.isnan(arrays["residual_growth"]).all() and arrays["residual_growth"].shape == (3,)
    final = group_rows([r["name"] for r in info], modules=[r["module"] for r in info])
    assert arrays["row_owner"].tolist() == final.owner.tolist()
    # leaves only (no block outputs): no residual stream; too few rows or nothing repeated: no view
    meta, _ = groups_live([r for r in info if r["type"] != "LlamaDecoderLayer"], min_rows=10)
    assert meta["residual"] is None
    assert groups_live(info) is None  # 38 rows < GROUPED_MIN_ROWS
    assert groups_live([{"name": f"fc{i}", "module": f"fc{i}"} for i in range(200)]) is None


def test_live_widget_sends_the_grouped_tree_once_per_row_set():
    """``push_history`` of a running thermometer sets the ``groups`` trait to the live tree when the
    rows change (not on every push); ``finish`` replaces it with the final payload."""
    from nbdebug.capture.history import History
    from nbdebug.widgets.thermometer import ThermometerWidget

    info = _llama_row_info(10)  # 113 rows: grouped
    names = [r["name"] for r in info]
    h = History.from_arrays([1, 2], names, {"mean": np.ones((2, len(names))), "std": np.ones((2, len(names)))},
                            row_info=info)
    w = ThermometerWidget.waiting()
    sent: list = []
    w.send = lambda content, buffers=None: sent.append(content)  # type: ignore[method-assign]
    try:
        assert w.groups == {}
        assert w.push_history(h)
        g = w.groups
        assert g["live"] is True and len(g["block_name"]["shape"]) == 1 and g["block_name"]["shape"][0] == 10
        assert g["residual"]["group"] == 0 and sent[0]["type"] == "history"
        h.append(3, np.arange(len(names)), np.ones((len(names), len(h.values("last")[0, 0]))))
        assert w.push_history(h)
        assert w.groups is g  # same rows: the tree is not sent again
    finally:
        w.close()


def test_payload_functions_moved_and_reexported() -> None:
    """groups_payload.py holds the payloads; ``nbdebug.inspectors.groups`` still exports them."""
    from nbdebug.inspectors import groups, groups_payload

    for name in ("group_history", "groups_live", "groups_payload", "groups_view"):
        assert getattr(groups, name) is getattr(groups_payload, name)
        assert getattr(groups_payload, name).__module__ == "nbdebug.inspectors.groups_payload"
    with pytest.raises(AttributeError):
        groups.no_such_name  # noqa: B018
