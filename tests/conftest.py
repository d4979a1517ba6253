"""Shared fixtures. Tiers: tests/unit (pure Python), tests/widget (widgets + magic in an
InteractiveShell), tests/models (offline pretrained models), tests/browser (real chromium)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
