"""Notebook cells that set up the small models of the widget tests (run in a fresh ``InteractiveShell``).

Each defines ``model`` and its input ``x`` (:func:`lm` can name them otherwise).
"""

from __future__ import annotations

#: Linear(4, 8) → ReLU → Linear(8, 3) on a 5×4 batch.
MLP = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
x = torch.randn(5, 4)
"""

#: Two 3×3 convs (4 and 6 channels) with ReLUs, pooled, Linear(6, 3), on 2×3×8×8.
CNN = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3))
x = torch.randn(2, 3, 8, 8)
"""

#: One 3×3 conv (4 channels), ReLU, pooled, Linear(4, 3), on 2×3×8×8: five layers "0".."4".
SMALL_CNN = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
x = torch.randn(2, 3, 8, 8)
"""


def lm(model: str = "model", ids: str = "x") -> str:
    """A tiny random GPT-2 (:func:`nbdebug.adapters.offline.tiny_lm`) as ``model`` and 7 token ids as ``ids``."""
    return f"""
import torch
from nbdebug.adapters.offline import tiny_lm
{model} = tiny_lm("gpt2")
{ids} = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(0))
"""


LM = lm()
