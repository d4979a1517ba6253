"""One view that does not apply (or fails) never hides the others, nor the cell's own outcome.

Through a fresh ``InteractiveShell``: views that apply are shown, the others become one quiet line
(the dashboard's notes, or a plain HTML note for a single view): no traceback, nothing on stderr, no
widget created for them. User errors (bad option values, unknown names) stay ``UsageError`` before
the cell runs. Test-only views are registered to fail at each stage a recorder goes through.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import ipywidgets
import pytest
import torch
import traitlets
from IPython.core.error import UsageError
from shell_cells import MLP  # tests/widget is on sys.path (rootdir-relative imports)
from shell_cells import SMALL_CNN as CNN
from torch import nn

from nbdebug import views
from nbdebug.api import Debug
from nbdebug.capture import HookSet, fingerprint, hook_count, same_fingerprint
from nbdebug.widgets.dashboard import Dashboard
from nbdebug.widgets.thermometer import ThermometerWidget

WIDGET = "application/vnd.jupyter.widget-view+json"


def widgets_shown(sh: Any) -> list[dict]:
    return [d for d in sh.displayed if WIDGET in d]


def notes_shown(sh: Any) -> list[str]:
    return [d["text/plain"] for d in sh.displayed if WIDGET not in d and "nbdebug-note" in d.get("text/html", "")]


# -- test-only views failing at one stage each -----------------------------------------------------
class Probe(views.Recorder):
    """Installs one forward hook while entered; fails at the stage named by the class attribute."""

    stage = ""
    seen: ClassVar[dict[str, Any]] = {}

    def __init__(self, model: nn.Module, **options: Any) -> None:
        super().__init__(model, **options)
        Probe.seen = dict(options)
        self.hooks = HookSet()
        self._fail("init")

    def _fail(self, stage: str) -> None:
        if self.stage == stage:
            raise RuntimeError(f"probe broke in {stage}")
        if self.stage == f"{stage}_interrupt":
            raise KeyboardInterrupt

    def __enter__(self) -> Probe:
        self.hooks.forward(self.model, lambda *a: None)
        self._fail("enter")
        return self

    def __exit__(self, *exc: object) -> None:
        self._fail("exit_before_cleanup")
        self.hooks.remove()
        self._fail("exit")

    def applies(self) -> str | None:
        self._fail("applies")
        return "nothing to probe here" if self.stage == "na" else None

    def result(self) -> Any:
        self._fail("result")
        return {"probe": True}

    def widget(self) -> Any:
        self._fail("widget")
        return ipywidgets.Label(f"probe {self.stage}")


STAGES = ["init", "enter", "exit", "applies", "result", "widget", "na"]
BAD_EXIT = "exit_before_cleanup"
INTERRUPTS = ["enter_interrupt", "exit_interrupt"]


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for stage in [*STAGES, BAD_EXIT, *INTERRUPTS]:
        cls = type(f"Probe_{stage}", (Probe,), {"stage": stage})
        globals()[cls.__name__] = cls
        monkeypatch.setitem(views.VIEWS, f"p{stage}", views.ViewSpec(f"p{stage}", "test probe", f"{__name__}:{cls.__name__}"))
    monkeypatch.setitem(views.VIEWS, "pok", views.ViewSpec("pok", "test probe", f"{__name__}:Probe"))
    yield


@pytest.mark.parametrize("stage", STAGES)
def test_a_view_failing_at_any_stage_leaves_the_others_and_the_cell_alone(shell, capsys, probes, created, stage: str) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(MLP).success
    before = fingerprint(shell.user_ns["model"])
    res = shell.run_cell(f"%%nndebug model --view thermometer,p{stage},pok -o out\ny = model(x)\nran = True\n7 * 6")
    assert res.success, res.error_in_exec
    assert res.result == 42 and shell.user_ns["ran"] is True
    assert capsys.readouterr().err == ""  # no traceback, no warning line
    dash = shell.user_ns["_nndebug_widget"]
    assert isinstance(dash, Dashboard) and list(dash.views) == ["thermometer", "pok"]
    reason = "nothing to probe here" if stage == "na" else f"RuntimeError: probe broke in {stage}"
    assert dash.notes == [f"not shown: p{stage} ({reason})"]
    assert "nbdebug-note" in dash._note_box.value and reason in dash._note_box.value
    assert set(shell.user_ns["out"]) == {"thermometer", "pok"}
    assert created.count("Label") == 1  # pok's widget; none created (and closed) for p{stage}
    model = shell.user_ns["model"]
    assert hook_count(model) == 0
    assert same_fingerprint(before, fingerprint(model)) == []


def test_exit_failing_before_its_own_cleanup_does_not_leak_the_others_hooks(shell, probes) -> None:  # type: ignore[no-untyped-def]
    """Recorders exit last-first; one raising in ``__exit__`` must not skip the exits after it."""
    assert shell.run_cell(MLP).success
    model = shell.user_ns["model"]
    res = shell.run_cell("%%nndebug model --view pok,thermometer,pexit_before_cleanup\nmodel(x)")
    assert res.success, res.error_in_exec
    # pexit_before_cleanup leaked its own hook (its bug), but thermometer and pok removed theirs
    assert hook_count(model) == 1
    assert shell.user_ns["_nndebug_widget"].notes == ["not shown: pexit_before_cleanup (RuntimeError: probe broke in exit_before_cleanup)"]
    for h in list(model._forward_hooks):
        del model._forward_hooks[h]


@pytest.mark.parametrize("stage", INTERRUPTS)
def test_keyboard_interrupt_in_a_recorder_still_cleans_up_every_other_one(shell, probes, stage: str) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C while a recorder starts (the cell does not run) or cleans up (the cell ran): every
    other recorder is exited, then the KeyboardInterrupt propagates."""
    assert shell.run_cell(MLP + "\nran = False").success
    model = shell.user_ns["model"]
    before = fingerprint(model)
    res = shell.run_cell(f"%%nndebug model --view pok,thermometer,p{stage},gradcam\nmodel(x)\nran = True")
    assert isinstance(res.error_in_exec, KeyboardInterrupt)
    assert shell.user_ns["ran"] is (stage == "exit_interrupt")
    assert hook_count(model) == 0 and same_fingerprint(before, fingerprint(model)) == []


def test_every_view_failing_still_runs_the_cell_and_shows_one_note(shell, capsys, probes, created) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(MLP).success
    res = shell.run_cell("%%nndebug model --view pinit,pna\nran = True\nraise ValueError('mine')")
    assert isinstance(res.error_in_exec, ValueError) and str(res.error_in_exec) == "mine"
    assert shell.user_ns["ran"] is True
    assert widgets_shown(shell) == [] and created == []
    assert notes_shown(shell) == ["not shown: pinit (RuntimeError: probe broke in init); pna (nothing to probe here)"]
    assert shell.user_ns["_nndebug_widget"] is None and shell.user_ns["_nndebug"] == {}
    assert "Traceback" not in capsys.readouterr().err.replace("ValueError", "")


def test_thermometer_and_gradcam_on_an_mlp(shell, capsys, created) -> None:  # type: ignore[no-untyped-def]
    """Issue 9 case 3: the thermometer is shown, Grad-CAM becomes one line; before, only an error."""
    assert shell.run_cell(MLP).success
    res = shell.run_cell("%%nndebug model --view thermometer,gradcam\nout = model(x)\nout.shape[1]")
    assert res.success, res.error_in_exec
    assert res.result == 3
    assert capsys.readouterr().err == ""
    assert len(widgets_shown(shell)) == 1
    dash = shell.user_ns["_nndebug_widget"]
    assert list(dash.views) == ["thermometer"] and isinstance(dash["thermometer"], ThermometerWidget)
    assert len(dash.notes) == 1 and dash.notes[0].startswith("not shown: gradcam (")
    assert "\n" not in dash.notes[0] and len(dash.notes[0]) < 200
    assert "GradCamWidget" not in created
    assert [r["name"] for r in dash["thermometer"].layers] == ["0", "1", "2"]
    assert hook_count(shell.user_ns["model"]) == 0


def test_all_on_a_cnn_is_quiet_and_creates_nothing_for_language_views(shell, capsys, created) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(CNN).success
    res = shell.run_cell("%%nndebug model --view all\nmodel(x)")
    assert res.success, res.error_in_exec
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "skipped" not in captured.out
    dash = shell.user_ns["_nndebug_widget"]
    assert list(dash.views) == ["thermometer", "featuremaps", "gradcam"]
    assert len(dash.notes) == 1 and dash.notes[0].startswith("not shown: attention, logitlens (")
    assert not {"AttentionWidget", "LogitLensWidget"} & set(created)
    assert created.count("ThermometerWidget") == created.count("GradCamWidget") == created.count("FeatureMapsWidget") == 1


@pytest.mark.parametrize(
    ("cell_line", "view", "why"),
    [
        ("--view gradcam", "gradcam", "spatial"),  # applies after the run: nothing spatial
        ("--view attention", "attention", "transformer blocks"),  # known before the run: no blocks
    ],
)
def test_single_view_that_does_not_apply_keeps_the_cell_and_shows_a_note(shell, capsys, created, cell_line: str, view: str, why: str) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(MLP).success
    res = shell.run_cell(f"%%nndebug model {cell_line} -o got\nran = True\nmodel(x).shape[0]")
    assert res.success, res.error_in_exec
    assert res.result == 5 and shell.user_ns["ran"] is True
    assert capsys.readouterr().err == ""
    assert widgets_shown(shell) == [] and created == []
    notes = notes_shown(shell)
    assert len(notes) == 1 and notes[0].startswith(f"not shown: {view} (") and why in notes[0]
    assert shell.user_ns["got"] is None and shell.user_ns["_nndebug_widget"] is None
    # the same cell raising: its exception is the one that propagates, the note is still shown
    shell.displayed.clear()
    res = shell.run_cell(f"%%nndebug model {cell_line}\nraise KeyError('user key')")
    assert isinstance(res.error_in_exec, KeyError) and res.error_in_exec.args == ("user key",)
    assert len(notes_shown(shell)) == 1
    assert hook_count(shell.user_ns["model"]) == 0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--view gradcam --layer nope", "no layer named 'nope'"),
        ("--view all --layers nope", "no layer named 'nope'"),
        ("--view all --class-names missing", "no variable named 'missing'"),
        ("--view thermometer,nope", "unknown view 'nope'"),
        ("--max-bytes 12XB", "write e.g. 64MB"),
        ("--max-bytes -1", "is not a size"),
    ],
)
def test_user_errors_stay_usage_errors_before_the_cell_runs(shell, line: str, message: str) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(CNN + "\nran = False").success
    res = shell.run_cell(f"%%nndebug model {line}\nran = True")
    assert isinstance(res.error_in_exec, UsageError), res.error_in_exec
    assert message in str(res.error_in_exec)
    assert shell.user_ns["ran"] is False
    assert hook_count(shell.user_ns["model"]) == 0


def test_keyboard_interrupt_propagates_unchanged_and_the_views_show_what_ran(shell, created) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(CNN).success
    before = fingerprint(shell.user_ns["model"])
    res = shell.run_cell("%%nndebug model --view thermometer,gradcam\nout = model(x)\nraise KeyboardInterrupt")
    assert isinstance(res.error_in_exec, KeyboardInterrupt)
    dash = shell.user_ns["_nndebug_widget"]
    # Grad-CAM would need a forward and backward of its own after the user pressed Ctrl-C: it says so instead
    assert list(dash.views) == ["thermometer"]
    assert dash.notes == ["not shown: gradcam (the cell was interrupted; Grad-CAM would need a new forward and backward "
                          "— re-run the cell to see it)"]
    assert "GradCamWidget" not in created
    assert [r["name"] for r in dash["thermometer"].layers] == ["0", "1", "2", "3", "4"]
    model = shell.user_ns["model"]
    assert hook_count(model) == 0 and same_fingerprint(before, fingerprint(model)) == []


def test_display_failing_does_not_hide_the_cell_value(shell, capsys, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(MLP).success

    def broken(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("display is broken")

    monkeypatch.setattr("IPython.display.display", broken)
    res = shell.run_cell("%%nndebug model\nmodel(x).shape[0] * 2")
    assert res.success and res.result == 10
    assert "could not show the view: RuntimeError: display is broken" in capsys.readouterr().err


def test_debug_api_isolates_views_too() -> None:
    m = nn.Sequential(nn.Linear(4, 3))
    dbg = Debug(m, "thermometer,attention,gradcam")
    assert dbg.views == ["thermometer", "gradcam"] and set(dbg.skipped) == {"attention"}
    with dbg:
        m(torch.randn(2, 4))
    assert hook_count(m) == 0
    assert [type(w).__name__ for w in dbg.widgets()] == ["ThermometerWidget"]
    assert dbg.views == ["thermometer"] and set(dbg.results) == {"thermometer"}
    assert dbg.note().startswith("not shown: attention (could not find the list of transformer blocks")
    assert "; gradcam (" in dbg.note()
    only = Debug(m, "gradcam")
    with only:
        m(torch.randn(2, 4))
    with pytest.raises(LookupError, match="not shown: gradcam"):
        only.widget()
    with pytest.raises(LookupError, match="not shown: gradcam"):
        _ = only.result


@pytest.mark.parametrize(
    ("flags", "config", "max_bytes"),
    [
        ("--max-bytes 64MB", None, 64 * 2**20),
        ("--max-bytes 1.5GB", None, 3 * 2**29),
        ("--max-bytes '512 KiB'", None, 512 * 2**10),
        ("--max-bytes 4096", None, 4096),
        ("--max-bytes 0", None, 0),  # honoured: keep nothing beyond scalar stats
        ("", None, 256 * 2**20),  # DEFAULT_MAX_BYTES
        ("", "'8MB'", 8 * 2**20),
        ("", "1000", 1000),
        ("", "0", 0),
        ("--max-bytes 2MB", "'8MB'", 2 * 2**20),  # the flag wins over the config
    ],
)
def test_max_bytes_units_reach_every_recorder_as_an_int(shell, probes, flags: str, config: str | None, max_bytes: int) -> None:  # type: ignore[no-untyped-def]
    from nbdebug.capture.budget import DEFAULT_MAX_BYTES

    assert DEFAULT_MAX_BYTES == 256 * 2**20
    assert shell.run_cell(MLP).success
    if config is not None:
        assert shell.run_cell(f"%config NNDebugMagics.max_bytes = {config}").success
    assert shell.run_cell(f"%%nndebug model --view pok,pna {flags}\nmodel(x)").success
    assert Probe.seen["max_bytes"] == max_bytes and type(Probe.seen["max_bytes"]) is int


def test_zero_thresholds_are_passed_on(shell, probes) -> None:  # type: ignore[no-untyped-def]
    assert shell.run_cell(MLP).success
    assert shell.run_cell("%config NNDebugMagics.vanishing = 0.0").success
    assert shell.run_cell("%%nndebug model --view pok --dead-threshold 0\nmodel(x)").success
    assert Probe.seen["dead_threshold"] == 0 and Probe.seen["vanishing"] == 0
    assert Probe.seen["exploding"] == 1e3  # unset: the configured default


def test_bad_max_bytes_in_config_is_refused_with_what_to_write(shell) -> None:  # type: ignore[no-untyped-def]
    magic = shell.magics_manager.registry["NNDebugMagics"]
    with pytest.raises(traitlets.TraitError, match=r"write e\.g\. 64MB"):
        magic.max_bytes = "lots"
    magic.max_bytes = "3 MB"
    assert magic.max_bytes == 3 * 2**20
    magic.max_bytes = 1.5e6
    assert magic.max_bytes == 1_500_000 and type(magic.max_bytes) is int


def test_help_says_the_unit_rule() -> None:
    from nbdebug.magic import NNDebugMagics

    doc = " ".join((NNDebugMagics.nndebug.__doc__ or "").split())
    assert "64MB" in doc and "MB = 2^20" in doc and "0 keeps nothing" in doc
