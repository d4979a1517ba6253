"""The "Works with" comparison itself (``works_with.py``): a ✓ that became a note fails, on the whole
tier and on any part of it; the two committed copies say the same thing. Pure Python, no model."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import works_with as W

#: a small matrix run: plain ✓ everywhere it ran, exception mid-cell: Grad-CAM stood down with a note
RUN = {
    ("plain", "thermometer"): "✓",
    ("plain", "gradcam"): "✓",
    ("plain", "all[cnn]"): "✓",
    ("plain", "all[gpt2]"): "✓",
    ("exception", "thermometer"): "✓",
    ("exception", "gradcam"): "the model raised during its first call, so there are no class scores to explain",
}


def copies(tmp_path: Path, outcomes: dict[tuple[str, str], str]) -> tuple[Path, Path]:
    """Both copies as a run of ``outcomes`` writes them, in ``tmp_path``."""
    full, docs = tmp_path / "WORKS_WITH.md", tmp_path / "works-with.md"
    docs.write_text(f"# Works with\n\nintro\n\n{W.BEGIN}\n{W.END}\n\n## after\n")
    W.rewrite(outcomes, full, docs)
    return full, docs


def test_tables_in_both_renderings() -> None:
    full = W.table_lines(RUN)
    brief = W.table_lines(RUN, brief=True)
    assert full[2] == "| plain forward (train-mode BatchNorm) | ✓ | — | ✓ | — | — | ✓ | — | — | — | — | — | — |"
    assert full[3] == "| exception mid-cell | ✓ | — | note: the model raised during its first call, so there are no class scores … | — | — | — | — | — | — | — | — | — |"
    assert brief[3] == "| exception mid-cell | ✓ | — | note: the model raised | — | — | — | — | — | — | — | — | — |"
    assert W.merge(["✓", "✗"]) == "partly (✓, ✗)" and W.merge([]) == "—" and W.merge(["✗"]) == "✗"
    assert W.short("an unknown | note") == "an unknown / note"


def test_a_run_that_agrees_passes_whole_and_in_part(tmp_path: Path) -> None:
    full, docs = copies(tmp_path, RUN)
    assert W.check(RUN, whole=True, write=False, full=full, docs=docs) == (True, [])
    part = {k: v for k, v in RUN.items() if k[0] == "exception"}
    assert W.check(part, whole=False, write=False, full=full, docs=docs) == (True, [])
    assert "## after" in docs.read_text() and "intro" in docs.read_text()


@pytest.mark.parametrize("whole", [True, False])
def test_a_tick_that_became_a_note_fails(tmp_path: Path, whole: bool) -> None:
    full, docs = copies(tmp_path, RUN)
    now = {**RUN, ("plain", "gradcam"): "no layer has a spatial output (B×C×H×W, B×H×W×C or a token grid)"}
    run = now if whole else {("plain", "gradcam"): now["plain", "gradcam"]}
    passed, lines = W.check(run, whole=whole, write=False, full=full, docs=docs)
    assert not passed
    assert "  ✓ became: plain forward (train-mode BatchNorm) × gradcam: committed ✓, this run: note: no spatial layer" in lines
    assert any(line.startswith("  ✓ became: plain forward") and "no layer has a spatial output" in line for line in lines)


def test_one_variant_of_a_column_failing_fails(tmp_path: Path) -> None:
    """``all`` is ✓ only when every family's ``all[…]`` is: one that fails is a downgrade."""
    full, docs = copies(tmp_path, RUN)
    passed, lines = W.check({("plain", "all[gpt2]"): "✗"}, whole=False, write=False, full=full, docs=docs)
    assert not passed and any("× all: committed ✓, this run: failed" in line for line in lines)


def test_rewriting_still_fails_on_a_downgrade_and_only_from_the_whole_tier(tmp_path: Path) -> None:
    full, docs = copies(tmp_path, RUN)
    before = docs.read_text()
    now = {**RUN, ("plain", "thermometer"): "the cell was interrupted"}
    passed, lines = W.check(now, whole=False, write=True, full=full, docs=docs)
    assert not passed and docs.read_text() == before and "nothing written" in lines[-1]
    passed, lines = W.check(now, whole=True, write=True, full=full, docs=docs)
    assert not passed and "note: interrupted, re-run" in docs.read_text()
    assert W.check(now, whole=True, write=False, full=full, docs=docs) == (True, [])  # the next run passes


def test_the_whole_tier_must_match_exactly(tmp_path: Path) -> None:
    """A note that became ✓, a cell no test produced any more, a new mode: only a run of the whole tier
    can tell, and it fails on each."""
    full, docs = copies(tmp_path, RUN)
    better = {**RUN, ("exception", "gradcam"): "✓"}
    assert W.check(better, whole=False, write=False, full=full, docs=docs)[0]  # a ✓ may sit in a note cell
    assert not W.check(better, whole=True, write=False, full=full, docs=docs)[0]
    fewer = {k: v for k, v in RUN.items() if k != ("plain", "gradcam")}
    assert not W.check(fewer, whole=True, write=False, full=full, docs=docs)[0]
    new = {**RUN, ("no_such_mode", "thermometer"): "✓"}
    passed, lines = W.check(new, whole=False, write=False, full=full, docs=docs)
    assert not passed and any("'no_such_mode' has no row label" in line for line in lines)


def test_the_committed_copies_say_the_same() -> None:
    """docs/works-with.md (notes in a few words) and WORKS_WITH.md (full notes): the same rows, the same
    ✓ and — in the same cells, each full note's few words in the docs cell."""
    full = W.parse(W.committed_table(W.FULL.read_text(), docs=False))
    docs = W.parse(W.committed_table(W.DOCS.read_text(), docs=True))
    assert full and set(full) == set(docs)
    for key, cell in full.items():
        if cell.startswith("note: "):
            assert docs[key].startswith("note: "), (key, docs[key])
        else:
            assert docs[key] == cell, (key, cell, docs[key])
