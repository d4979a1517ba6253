"""Review findings T1 and T2 on issue 26's output rules, each with the run that showed it (h-review,
/work/wt/REVIEW.md): a loss at chance judged on step numbers, not kept steps; a healthy Sigmoid + BCELoss on
soft targets is not "sigmoid applied twice"."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import nbdebug


def test_a_long_run_at_chance_kept_every_10th_step_still_warns_and_says_its_steps() -> None:
    """Labels dealt out apart from the inputs, 300 Adam steps, every=10 (31 kept steps): a warning over
    steps 150–300, not "too early" after "31 steps"."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300 * 64, 20, generator=g)
    y = (torch.arange(len(x)) % 5)[torch.randperm(len(x), generator=g)]  # 5 balanced classes, unrelated to x
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    with nbdebug.debug(m, every=10) as dbg:
        for i in range(300):
            opt.zero_grad()
            F.cross_entropy(m(x[i * 64:(i + 1) * 64]), y[i * 64:(i + 1) * 64]).backward()
            opt.step()
    res = dbg.result
    assert len(res.history.step_index) < 50 <= int(res.history.step_index[-1])
    f = next(f for f in res.findings if f.code == "loss_at_chance")
    assert f.severity == "warning" and "over steps " in f.text and "–300" in f.text, res.findings


def test_sigmoid_with_bce_on_soft_targets_is_quiet_and_bce_with_logits_on_it_still_warns() -> None:
    """A reconstruction model: Sigmoid output, targets in [0.05, 0.95] (entropy floor 0.34, inside BCEWithLogits'
    range on probabilities): with F.binary_cross_entropy (right) no finding; with BCEWithLogits (sigmoid twice)
    on hard targets the rule still fires."""
    torch.manual_seed(0)
    n, d = 4096, 64
    z = torch.randn(n, 8)
    proj = torch.randn(8, d)
    soft = 0.05 + 0.9 * torch.sigmoid(6 * (z @ proj) / 8**0.5)
    for loss_fn, target, want in ((F.binary_cross_entropy, soft, []),
                                  (F.binary_cross_entropy_with_logits, (z @ proj > 0).float(), ["output_loss_mismatch"])):
        torch.manual_seed(1)
        m = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, d), nn.Sigmoid())
        opt = torch.optim.Adam(m.parameters(), lr=3e-3)
        with nbdebug.debug(m) as dbg:
            for i in range(200):
                j = (i * 64) % n
                opt.zero_grad()
                loss_fn(m(z[j:j + 64]), target[j:j + 64]).backward()
                opt.step()
        assert [f.code for f in dbg.result.findings if f.severity != "note"][:1] == want, dbg.result.findings


def test_a_high_update_ratio_alone_is_info_in_the_step_diagnoses_too() -> None:
    """T3: a healthy MLP with Adam 1e-2 (ratios just above 0.01, the loss falls): the findings hold notes only,
    and the report's diagnosis at the last step says "info", as the browser's step texts do, never "warning"."""
    from nbdebug.inspectors.thermometer import diagnose

    g = torch.Generator().manual_seed(2)
    x = torch.randn(60 * 64, 20, generator=g)
    y = (x @ torch.randn(20, 5, generator=g)).argmax(1)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    with nbdebug.debug(m) as dbg:
        for i in range(60):
            opt.zero_grad()
            F.cross_entropy(m(x[i * 64:(i + 1) * 64]), y[i * 64:(i + 1) * 64]).backward()
            opt.step()
    assert all(f.severity == "note" for f in dbg.result.findings), dbg.result.findings
    ups = [d for d in diagnose(dbg.result).diagnoses if d.code == "update_ratio"]
    assert ups and all(d.severity == "info" and "high" in d.message for d in ups), ups
