"""One ablation request and one answer for the attention view's heads, the feature-map view's channels
and the thermometer's rows (``nbdebug.sessions.ablation_io``; ``js/src/lib/ablation.ts`` in TypeScript).

Through ``%%nndebug`` in a fresh InteractiveShell on tiny models: each view takes the one request shape
and answers with exactly the keys and types of ``AblationAnswer`` (its own part: the lens diff, the CAM
maps, the top-1 agreement), JSON as it is sent; the answer's numbers are the session's own ``ablate``
(the one shape is a renaming, not another computation); a request of another view's kind, or in a kind's
old shape, is refused with a clear error. The request parser itself: merged targets, sorted units,
every malformed request a ``ValueError`` that says what to send.
"""

from __future__ import annotations

import json
import re
import types
import typing
from typing import Any

import pytest

from nbdebug.sessions.ablation_io import (
    AblationAnswer,
    AblationMetric,
    AblationTarget,
    CamPair,
    LensDiff,
    Ranked,
    Tops,
    ablation_request,
)

LM = """
import torch
from nbdebug.adapters.offline import tiny_lm
model = tiny_lm("gpt2", layers=3, heads=4, d=32)
x = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(1))
"""
CNN = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 6)).eval()
x = torch.rand(2, 3, 16, 16)
"""
LOOP = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(8, 6), torch.randint(0, 4, (8,))) for _ in range(2)]
"""
LOOP_BODY = "for xb, yb in data:\n    opt.zero_grad(); loss = nn.functional.cross_entropy(model(xb), yb); loss.backward(); opt.step()"

#: per view: set-up, magic line and body, the one request it sends, its own part of the answer
VIEWS = {
    "heads": (LM, "%%nndebug model --view attention\nout = model(x)",
              {"kind": "heads", "targets": [{"layer": 2, "units": [0]}, {"layer": 1, "units": [2]}], "mode": "zero"}, "lens"),
    "channels": (CNN, "%%nndebug model --view featuremaps\nout = model(x)",
                 {"kind": "channels", "targets": [{"layer": "0", "units": [5, 1]}], "mode": "mean"}, "cam"),
    "modules": (LOOP, f"%%nndebug model --view thermometer -o t\n{LOOP_BODY}",
                {"kind": "modules", "targets": [{"layer": "2", "units": []}], "mode": "zero"}, "agreement"),
}


def conforms(value: Any, hint: Any, where: str = "answer") -> list[str]:
    """Where ``value`` does not have the type ``hint`` (a TypedDict: exactly its keys, required ones
    present): a list of paths, empty when it conforms."""
    if typing.is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not a {hint.__name__}"]
        hints = typing.get_type_hints(hint)
        out = [f"{where}.{k}: not in {hint.__name__}" for k in value if k not in hints]
        out += [f"{where}.{k}: missing" for k in hint.__required_keys__ if k not in value]
        for k, v in value.items():
            if k in hints:
                out += conforms(v, hints[k], f"{where}.{k}")
        return out
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.NotRequired:
        return conforms(value, args[0], where)
    if origin in (typing.Union, types.UnionType):
        return [] if any(not conforms(value, a, where) for a in args) else [f"{where}: {value!r} is none of {args}"]
    if origin is typing.Literal:
        return [] if value in args else [f"{where}: {value!r} not one of {args}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: not a list"]
        return [e for i, v in enumerate(value) for e in conforms(v, args[0], f"{where}[{i}]")]
    if hint is type(None):
        return [] if value is None else [f"{where}: not None"]
    if hint is float:
        return [] if isinstance(value, (int, float)) and not isinstance(value, bool) else [f"{where}: not a number"]
    return [] if isinstance(value, hint) and not (hint is int and isinstance(value, bool)) else [f"{where}: not {hint.__name__}"]


def view(shell: Any, kind: str) -> Any:
    setup, cell, _, _ = VIEWS[kind]
    assert shell.run_cell(setup).success
    res = shell.run_cell(cell)
    assert res.success, res.error_in_exec
    return shell.user_ns["_nndebug_widget"]


@pytest.mark.parametrize("kind", list(VIEWS))
def test_each_view_takes_the_one_request_and_sends_the_one_answer(shell, kind: str) -> None:  # type: ignore[no-untyped-def]
    w = view(shell, kind)
    _, _, request, own = VIEWS[kind]
    content, buffers = w.handle_request("ablate", request)
    answer = json.loads(json.dumps(content["result"]))  # as the browser reads it
    assert conforms(answer, AblationAnswer) == []
    assert answer["kind"] == kind and answer["mode"] == request["mode"]
    assert answer["targets"] == ablation_request(request, kind)["targets"]  # normalised: layers merged, units sorted
    parts = {"lens", "cam", "agreement"} & set(answer)
    assert parts == {own}, f"{kind} answers with {parts}"
    # the one shape renames the session's own answer, it does not compute another
    t = answer["targets"]
    if kind == "heads":
        native = w.ablation.ablate(heads={x["layer"]: x["units"] for x in t}, mode="zero")
        assert answer["metric"]["delta"] == pytest.approx(native["delta"], rel=1e-9, abs=1e-12)
        assert [r["id"] for r in answer["top"]["ablated"]] == [r["id"] for r in native["ablated"]]
        lens = answer["lens"]  # two lens columns in THE lens-column format (sessions.lens.LensEntry)
        assert [e["p_answer"] for e in lens["ablated"]] == native["lens"]["ablated_p"]
        assert [e["row"] for e in lens["clean"]] == native["lens"]["rows"] and len(lens["clean"]) == 3 + 1
        assert [e["id"] for e in lens["clean"]] == native["lens"]["clean_ids"]
        # the output row is the model's own next-token distribution: its top-1 is the top list's first
        assert lens["ablated"][-1]["id"] == answer["top"]["ablated"][0]["id"]
        assert lens["ablated"][-1]["p"] == pytest.approx(answer["top"]["ablated"][0]["p"], rel=1e-5)
    elif kind == "channels":
        native = w.ablation.ablate("0", [1, 5], "mean")
        assert answer["metric"]["delta"] == pytest.approx(native["delta"], abs=1e-12) and native["delta"] != 0
        assert answer["metric"]["of"] == {"id": native["cls"], "label": native["label"]}
        assert answer["top"]["ablated"] == native["top"] and answer["top"]["clean"] == native["top_clean"]
        assert set(content["arrays"]) == {"cam", "cam_clean"} and len(buffers) == 2
        assert answer["cam"] == {"layer": native["cam_layer"], "shape": list(native["cam"].shape)}
    else:
        native = w.ablation.ablate("2", "zero")
        assert answer["metric"]["kind"] == native["kind"] == "output" and answer["top"] is None
        assert answer["metric"]["delta"] == native["delta"] and answer["agreement"] == native["agreement"]
        assert answer["note"] == native["note"] != ""


@pytest.mark.parametrize("kind", list(VIEWS))
def test_a_view_refuses_another_views_request_and_the_old_shapes(shell, kind: str) -> None:  # type: ignore[no-untyped-def]
    w = view(shell, kind)
    other = next(k for k in VIEWS if k != kind)
    with pytest.raises(ValueError, match=f"an ablation of '{other}' was sent to a view that ablates {kind}"):
        w.handle_request("ablate", VIEWS[other][2])
    old = {"heads": {"heads": [[1, 2]], "mode": "zero"}, "channels": {"layer": "0", "channels": [1], "mode": "zero"},
           "modules": {"module": "2", "mode": "zero"}}[kind]
    with pytest.raises(ValueError, match=r"an ablation request is \{kind, targets: \[\{layer, units\}\], mode\}; got the keys"):
        w.handle_request("ablate", old)  # a panel still speaking its old shape is told, not answered


def test_the_request_is_normalised() -> None:
    r = ablation_request({"kind": "heads", "targets": [{"layer": "2", "units": [3, 1]}, {"layer": 0, "units": [1]},
                                                       {"layer": 2, "units": [1]}]}, "heads")
    assert r == {"kind": "heads", "targets": [{"layer": 0, "units": [1]}, {"layer": 2, "units": [1, 3]}], "mode": "zero"}
    r = ablation_request({"targets": [{"layer": "fc", "units": []}], "mode": "mean"}, "modules")
    assert r == {"kind": "modules", "targets": [{"layer": "fc", "units": []}], "mode": "mean"}
    assert conforms(r["targets"][0], AblationTarget) == []


@pytest.mark.parametrize(("kind", "params", "message"), [
    ("heads", {"kind": "heads", "targets": []}, "no head to ablate: click a head first"),
    ("heads", {"heads": [[0, 1]], "mode": "zero"}, "an ablation request is {kind, targets: [{layer, units}], mode}; got the keys ['heads', 'mode']"),
    ("heads", {"kind": "heads", "targets": [{"layer": 0, "units": [1]}], "mode": "resample"}, "mode='resample': one of zero, mean"),
    ("heads", {"kind": "heads", "targets": [[0, 1]]}, "a target is {layer, units}"),
    ("channels", {"kind": "channels", "targets": [{"layer": "a", "units": [1]}, {"layer": "b", "units": [2]}]}, "one layer at a time"),
    ("channels", {"kind": "channels", "targets": [{"layer": "a", "units": []}]}, "no channel to ablate"),
    ("modules", {"kind": "modules", "targets": [{"layer": "fc", "units": [3]}]}, "whole output: send no units"),
    ("modules", {"kind": "modules", "targets": [{"layer": "a", "units": []}, {"layer": "b", "units": []}]}, "one module at a time"),
    ("rows", {"kind": "rows", "targets": []}, "kind='rows': one of heads, channels, modules"),
])
def test_a_malformed_request_says_what_to_send(kind: str, params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ablation_request(params, kind)


def test_the_conformance_check_finds_a_planted_wrong_answer() -> None:
    """The checker these tests rely on catches a missing key, an extra key and a wrong type."""
    good: dict[str, Any] = {"kind": "modules", "targets": [{"layer": "fc", "units": []}], "mode": "zero",
                            "metric": {"label": "loss", "kind": "loss", "clean": 1.0, "ablated": 1.5, "delta": 0.5, "of": None},
                            "top": None, "note": "", "seconds": 0.01}
    assert conforms(good, AblationAnswer) == []
    assert conforms({k: v for k, v in good.items() if k != "note"}, AblationAnswer) == ["answer.note: missing"]
    assert conforms({**good, "delta": 0.5}, AblationAnswer) == ["answer.delta: not in AblationAnswer"]
    assert conforms({**good, "metric": {**good["metric"], "kind": "Δ"}}, AblationAnswer) != []
    assert conforms({**good, "top": {"clean": [{"id": 1, "token": "a", "p": 0.5}], "ablated": []}}, AblationAnswer) != []
    assert conforms({**good, "cam": {"layer": "x", "shape": [2, "2"]}}, AblationAnswer) == ["answer.cam.shape[1]: not int"]
    for td in (AblationMetric, Ranked, Tops, LensDiff, CamPair):
        assert typing.is_typeddict(td)
