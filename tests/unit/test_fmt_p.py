"""`fmt_p`: probabilities written as the front-end's `fmtPct` writes them (one way in every view)."""

import math

import pytest

from nbdebug.inspectors.events import fmt_p


@pytest.mark.parametrize(("p", "text"), [
    (0.791, "79%"), (0.0, "0%"), (0.0004, "<0.1%"), (0.9996, ">99.9%"), (1.0, "100%"),
    (0.055, "5.5%"), (0.1, "10%"), (0.996, "99.6%"), (0.123, "12%"), (math.nan, "NaN"),
])
def test_fmt_p_matches_js_fmtpct(p: float, text: str) -> None:
    assert fmt_p(p) == text
