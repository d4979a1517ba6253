"""The feature-map view's headline: which channels are silent, said of what one sample can show
("silent on this input", never "dead"), on the layer the view opens on: the first one asked for."""

from __future__ import annotations

import torch
from torch import nn

from nbdebug.inspectors.featuremaps import channel_stats, layer_headline
from nbdebug.recorders.featuremaps import FeatureMapsRecorder


def _net() -> nn.Sequential:
    """conv(3→4, 1×1) → ReLU → conv(4→6, stride 2) → ReLU → pool → linear. After the first ReLU,
    channel 1 is zero on every input (bias −100); channels 0, 2 and 3 copy the positive part of input
    channels 1, 0 and 2: channel 2 is zero only on inputs whose channel 0 is negative everywhere."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 2))
    with torch.no_grad():
        net[0].weight.zero_()
        net[0].bias.zero_()
        net[0].bias[1] = -100.0
        net[0].weight[0, 1] = net[0].weight[2, 0] = net[0].weight[3, 2] = 1.0
    return net


def test_one_image_says_silent_on_this_input_never_dead() -> None:
    net = _net()
    x = torch.rand(1, 3, 8, 8) + 0.1
    x[:, 0] *= -1  # input channel 0 all negative: channel 2 is silent on this input only
    rec = FeatureMapsRecorder(net, layers="1")
    with rec, torch.no_grad():
        net(x)
    w = rec.widget()
    assert w.layer == "1"
    stats = channel_stats(rec.result()["1"].maps(0))
    assert stats.dead.tolist() == [False, True, True, False]  # the naive reading: "2 dead"
    assert w.headline == "`1`: 2 of 4 channels are silent on this input (every value 0): 1 and 2."
    assert "dead" not in w.headline and "dead" not in w.fallback_html()
    html = w.fallback_html()
    assert html.index("<code>1</code>: 2 of 4 channels are silent on this input (every value 0)") < html.index("<img")
    assert "`" not in html  # the layer name as a code span, as the live view and every other view write it
    # another input excites channel 2: one sample could not have called it dead
    with torch.no_grad():
        again = net[1](net[0](x.abs()))
    assert again[0, 2].abs().sum() > 0 and again[0, 1].abs().sum() == 0


def test_several_samples_say_which_channels_are_silent_on_all_of_them() -> None:
    net = _net()
    x = torch.rand(3, 3, 8, 8) + 0.1
    x[0, 0] *= -1  # sample 0: channel 2 silent; samples 1, 2: not
    rec = FeatureMapsRecorder(net, layers=["1", "3"])
    with rec, torch.no_grad():
        net(x)
    w = rec.widget()
    assert w.layer == "1" and w.sample == 0
    assert w.headline == ("`1`: 2 of 4 channels are silent on sample 0 (every value 0): 1 and 2; "
                          "1 is silent on all 3 kept inputs.")
    w.sample = 1  # the browser's sample picker: the sentence follows
    assert w.headline == "`1`: 1 of 4 channels is silent on sample 1 (every value 0): 1; it is silent on all 3 kept inputs."
    w.layer = "3"
    assert w.headline.startswith("`3`: ")


def test_no_silent_channel_names_the_one_that_peaks() -> None:
    x = torch.tensor([[[1.0, 0.0], [2.0, 0.5]], [[0.0, 3.0], [1.0, 1.0]]])
    assert layer_headline("c", channel_stats(x)) == (
        "`c`: all 2 channels respond to this input; channel 1 peaks highest (max 3; 25% of all values are 0).")
    assert layer_headline("c", channel_stats(x), sample=2, samples=4).startswith("`c`: all 2 channels respond to sample 2;")


def test_opens_on_the_first_layer_asked_for_not_the_deepest() -> None:
    net = _net()
    rec = FeatureMapsRecorder(net, layers=["3", "1"])  # the order written, not the forward order
    with rec, torch.no_grad():
        net(torch.randn(1, 3, 8, 8))
    assert list(rec.result().layers) == ["1", "3"]
    assert rec.result().default_layer == "3"
    rec = FeatureMapsRecorder(net, layers="1,3".split(","))  # the tutorial's `--layers _blocks.1,_blocks.15`
    with rec, torch.no_grad():
        net(torch.randn(1, 3, 8, 8))
    w = rec.widget()
    assert w.layer == "1" and w.headline.startswith("`1`: ")
    rec = FeatureMapsRecorder(net)  # nothing asked: the deepest spatial output, where Grad-CAM looks first
    with rec, torch.no_grad():
        net(torch.randn(1, 3, 8, 8))
    assert rec.result().default_layer == "3"


def test_many_silent_channels_are_counted_after_eight() -> None:
    stats = channel_stats(torch.zeros(12, 2, 2))
    assert layer_headline("c", stats) == ("`c`: 12 of 12 channels are silent on this input (every value 0): "
                                          "0, 1, 2, 3, 4, 5, 6, 7 and 4 others.")
    nine = channel_stats(torch.cat([torch.zeros(9, 2, 2), torch.ones(1, 2, 2)]))
    assert layer_headline("c", nine).endswith(": 0, 1, 2, 3, 4, 5, 6, 7 and 8.")
