"""`--view all` / several views: one dashboard of tabs from one run, selections linked in Python."""

from __future__ import annotations

import pytest
import torch
import traitlets
from shell_cells import CNN, lm
from torch import nn

from nbdebug.api import Debug
from nbdebug.capture import fingerprint, hook_count, same_fingerprint
from nbdebug.widgets.dashboard import Dashboard
from nbdebug.widgets.thermometer import ThermometerWidget

LM = lm("lm", "ids")


WIDGET = "application/vnd.jupyter.widget-view+json"


def shown(sh) -> list[dict]:  # type: ignore[no-untyped-def]
    return [d for d in sh.displayed if WIDGET in d]


def tab_titles(dash: Dashboard) -> list[str]:
    return list(dash.tab.titles)


def test_all_on_a_cnn_gives_vision_tabs_and_says_why_language_views_are_skipped(shell) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(CNN).success
    before = fingerprint(shell.user_ns["model"])
    res = shell.run_cell("%%nndebug model --view all -o caps\nout = model(x)\nout.sum().item()")
    assert res.success, res.error_in_exec
    assert len(shown(shell)) == 1  # one widget: the dashboard
    dash = shell.user_ns["_nndebug_widget"]
    assert isinstance(dash, Dashboard)
    assert list(dash.views) == ["thermometer", "featuremaps", "gradcam"] == tab_titles(dash)
    assert [type(w).__name__ for w in dash.tab.children] == ["ThermometerWidget", "FeatureMapsWidget", "GradCamWidget"]
    assert [w for w in dash] == list(dash.tab.children) and dash["gradcam"] is dash.tab.children[2]
    # `--view all` means "whatever applies": the gist of why not, one quiet line (no warning, no stderr)
    assert dash.notes == ["not shown: attention, logitlens (could not find the list of transformer blocks in Sequential)"]
    assert "not shown: attention, logitlens (" in dash._note_box.value and "nbdebug-note" in dash._note_box.value
    caps = shell.user_ns["caps"]
    assert set(caps) == {"thermometer", "featuremaps", "gradcam"} and caps is shell.user_ns["_nndebug"]
    assert [lay["name"] for lay in dash["featuremaps"].layers] == ["0", "1", "2", "3"]
    bundle = shown(shell)[0]
    assert "nbdebug dashboard" in bundle["text/html"] and "nbdebug thermometer" in bundle["text/html"]
    model = shell.user_ns["model"]
    assert hook_count(model) == 0
    assert same_fingerprint(before, fingerprint(model)) == []


def test_all_on_a_tiny_gpt2_gives_language_tabs_and_creates_no_vision_widget(shell, capsys, created) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(LM).success
    res = shell.run_cell("%%nndebug lm --view all\nlm(ids)")
    assert res.success, res.error_in_exec
    assert capsys.readouterr().err == ""
    dash = shell.user_ns["_nndebug_widget"]
    assert tab_titles(dash) == ["thermometer", "attention", "logitlens"]
    assert [type(w).__name__ for w in dash] == ["ThermometerWidget", "AttentionWidget", "LogitLensWidget"]
    assert len(dash.notes) == 1 and dash.notes[0].startswith("not shown: ")
    assert "featuremaps" in dash.notes[0] and "gradcam" in dash.notes[0] and "spatial" in dash.notes[0]
    # no feature-map / Grad-CAM widget is created (and closed): the front-end would log
    # "[anywidget] Failed to initialize model" for each
    assert not {"FeatureMapsWidget", "GradCamWidget"} & set(created), created
    assert hook_count(shell.user_ns["lm"]) == 0


def test_thermometer_row_opens_that_layer_in_feature_grid_and_gradcam(shell) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(CNN).success
    assert shell.run_cell("%%nndebug model --view thermometer,featuremaps,gradcam\nmodel(x)").success
    dash = shell.user_ns["_nndebug_widget"]
    th, fm, gc = dash["thermometer"], dash["featuremaps"], dash["gradcam"]
    assert gc.layer == "3" and fm.layer in {lay["name"] for lay in fm.layers}  # the defaults (auto layers)
    fm.selected = 2
    th.selected = "1"
    assert (fm.layer, gc.layer, fm.selected) == ("1", "1", -1)
    assert dash.selection == {"view": "thermometer", "layer": "1"}
    # a row the vision views do not have (the Linear) leaves them where they are
    th.selected = "6"
    assert (fm.layer, gc.layer) == ("1", "1")
    assert dash.selection == {"view": "thermometer", "layer": "6"}
    # the Grad-CAM widget can compute the newly selected layer's maps on request
    content, _buffers = gc.handle_request("view", {"layer": gc.layer, "sample": 0})
    assert content["result"]["layer"] == "1"


def test_selection_set_from_python_drives_the_views(shell) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(CNN).success
    assert shell.run_cell("%%nndebug model --view all\nmodel(x)").success
    dash = shell.user_ns["_nndebug_widget"]
    dash.selection = {"view": "thermometer", "layer": "2"}
    assert dash["thermometer"].selected == "2"
    assert dash["featuremaps"].layer == "2" and dash["gradcam"].layer == "2"
    dash.selection = {"view": "featuremaps", "layer": "3"}
    assert dash["featuremaps"].layer == "3" and dash["gradcam"].layer == "3"
    with pytest.raises(traitlets.TraitError, match="no such view"):
        dash.selection = {"view": "attention", "head": 0}


def test_language_links_lens_column_to_attention_and_head_to_thermometer() -> None:
    from nbdebug.adapters.offline import tiny_lm

    lm = tiny_lm("gpt2")
    ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(0))
    with Debug(lm, "all") as dbg:
        lm(ids)
    assert hook_count(lm) == 0
    dash = dbg.dashboard()
    th, att, lens = dash["thermometer"], dash["attention"], dash["logitlens"]
    assert att.layer_names == ["transformer.h.0.attn", "transformer.h.1.attn"]
    assert att.highlight_token == -1
    # pinning a cell selects its column: attention marks that token
    lens.pinned = [[0, 4]]
    assert att.highlight_token == 4 and dash.selection == {"view": "logitlens", "token": 4}
    lens.pinned = [[0, 4], [1, 2]]
    assert att.highlight_token == 2
    lens.pinned = [[1, 2]]  # unpinning selects nothing new
    assert att.highlight_token == 2
    # a head of layer 1 selects the thermometer row of block transformer.h.1 (its attention module's first row)
    att.selected = [[1, 1]]
    assert th.selected == "transformer.h.1.attn.c_attn"
    assert dash.selection == {"view": "attention", "layer": 1, "head": 1, "row": "transformer.h.1.attn.c_attn"}
    att.selected = [[0, 0], [1, 0]]  # the first head counts
    assert th.selected == "transformer.h.0.attn.c_attn"
    # and from Python
    dash.selection = {"view": "attention", "layer": 1, "head": 0}
    assert att.selected == [[1, 0]] and th.selected == "transformer.h.1.attn.c_attn"
    dash.selection = {"view": "logitlens", "token": 6}
    assert att.highlight_token == 6
    dash.close()
    assert all(w.comm is None for w in [dash, dash.tab, th, att, lens])


def test_block_row_found_without_an_attention_module_row() -> None:
    """When the thermometer has no row under the head's attention module, any row of the block does."""
    from nbdebug.adapters.offline import tiny_lm

    lm = tiny_lm("gpt2")
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(1))
    with Debug(lm, ["thermometer", "attention"], layers=["re:transformer\\.h\\.\\d+\\.mlp\\.c_fc"]) as dbg:
        lm(ids)
    dash = dbg.dashboard()
    assert [r["name"] for r in dash["thermometer"].layers] == ["transformer.h.0.mlp.c_fc", "transformer.h.1.mlp.c_fc"]
    dash["attention"].selected = [[1, 0]]
    assert dash["thermometer"].selected == "transformer.h.1.mlp.c_fc"


def test_explicit_list_keeps_the_views_that_apply_and_single_view_is_unchanged() -> None:
    m = nn.Sequential(nn.Linear(4, 3))
    listed = Debug(m, "thermometer,attention")  # before: ValueError, nothing shown
    assert listed.views == ["thermometer"] and "transformer blocks" in listed.skipped["attention"]
    dbg = Debug(m, "all")
    assert dbg.views == ["thermometer", "featuremaps", "gradcam"] and set(dbg.skipped) == {"attention", "logitlens"}
    one = Debug(m, "thermometer")
    with one:
        m(torch.randn(2, 4))
    assert not one.tabbed and isinstance(one.widget(), ThermometerWidget)


def test_rerunning_a_dashboard_cell_closes_the_previous_one(shell) -> None:  # type: ignore[no-untyped-def]
    import gc

    from ipywidgets.widgets.widget import _instances

    assert shell.run_cell(CNN).success
    cell = "%%nndebug model --view all\nmodel(x).sum().backward()"
    assert shell.run_cell(cell).success
    first = shell.user_ns["_nndebug_widget"]
    gc.collect()
    count = len(_instances)
    for _ in range(3):
        assert shell.run_cell(cell).success
    gc.collect()
    assert len(_instances) == count  # dashboard, tabs, notes, views and their layouts all closed
    assert first.comm is None and all(w.comm is None for w in first)
    assert shell.user_ns["_nndebug_widget"] is not first
    assert hook_count(shell.user_ns["model"]) == 0
