"""The "Works with" table (rows = modes, columns = views), built from the real-use matrix's outcomes
and compared with the two committed copies on every run of the tier (``conftest.py``).

Two renderings of one table: ``tests/envelope/WORKS_WITH.md`` (each note as the view wrote it, cut at
70 characters) and the table inside ``docs/works-with.md`` (the page README links; each note in a few
words, ``SHORT``). An outcome is ``✓`` (the view's content was checked), a note (the view stood down
with that one-line note), or ``✗`` (failed, or a strict xfail).

>>> outcomes = {("plain", "thermometer"): "✓", ("plain", "all[cnn]"): "✓"}
>>> table_lines(outcomes)[-1]
'| plain forward (train-mode BatchNorm) | ✓ | — | — | — | — | ✓ | — | — | — | — | — | — |'
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FULL = ROOT / "tests" / "envelope" / "WORKS_WITH.md"
DOCS = ROOT / "docs" / "works-with.md"
BEGIN = "<!-- works-with table: written by tests/envelope (NBDEBUG_WORKS_WITH=1 pytest tests/envelope); do not edit by hand -->"
END = "<!-- end of the works-with table -->"

VIEWS = ["thermometer", "featuremaps", "gradcam", "attention", "logitlens", "all", "patch", "ablate", "steer", "patching", "attribution", "cams"]
LABELS = {
    "plain": "plain forward (train-mode BatchNorm)",
    "no_grad": "`torch.no_grad()`",
    "inference_mode": "`torch.inference_mode()`",
    "autocast": "`torch.autocast(\"cpu\", bfloat16)`",
    "pending_backward": "`out.backward()` after the view",
    "user_hooks": "your own forward hooks on the model",
    "exception": "exception mid-cell",
    "keyboard_interrupt": "KeyboardInterrupt mid-cell",
    "shape_error": "shape mismatch inside the model",
    "dtype_error": "dtype mismatch (half model, float32 batch)",
    "interrupt_in_forward": "KeyboardInterrupt inside `forward`",
    "nan_loop": "loop, NaN at step k",
    "generate": "`model.generate()`",
    "generate_user_hooks": "`model.generate()` with your own hooks",
    "shared": "module called twice (`relu`, `relu#2`)",
    "ckpt_reentrant": "`checkpoint(use_reentrant=True)`",
    "ckpt_nonreentrant": "`checkpoint(use_reentrant=False)`",
    "hf_ckpt": "HF `gradient_checkpointing_enable()`",
    "compiled": "`torch.compile`d model",
    "compiled_loop": "`torch.compile`d model trained in the loop (warmed up before the cell)",
    "fx_traced": "`torch.fx.symbolic_trace`d model",
    "torchscript": "TorchScript module (`torch.jit.trace` / `script` / `load`)",
    "script_child": "a TorchScript block inside a Python model",
    "exported": "`torch.export`ed graph (`exported.module()`)",
    "offloaded": "accelerate-offloaded model (CPU + disk `device_map`), `no_grad`",
    "offloaded_generate": "accelerate-offloaded model, `generate()`",
    "fp16": "float16 model",
    "bf16": "bfloat16 model",
    "int_outputs": "integer / bool outputs",
    "channels_last": "channels-last CNN",
    "dropout": "dropout in training mode",
    "train_step": "training loop (optimizer steps) in the cell",
    "train_history": "training loop: per-step history equal to the loop's own measurements",
    "train_eval": "eval forwards (`no_grad`) inside the training loop",
    "grad_scaler": "bf16 autocast + `GradScaler(\"cpu\")` with a skipped step",
    "train_bf16": "bfloat16 model trained without a GradScaler",
    "train_fp16": "float16 model trained without a GradScaler",
    "autocast_fp16": "`torch.autocast(\"cpu\", float16)` training without a GradScaler",
    "hf_trainer": "`transformers.Trainer.train()` in the cell (accumulation, evaluation)",
    "lightning": "Lightning `trainer.fit` in the cell (`training_step` calls submodules)",
    "anomaly": "`torch.autograd.detect_anomaly()` around the training loop",
    "anomaly_nan": "`detect_anomaly()` and an overflow (its RuntimeError; history up to that step)",
    "compiled_autograd": "the backward under compiled autograd (`torch._dynamo.compiled_autograd`; gradient norms read before the optimizer step)",
    "eval_loop": "evaluation loop over batches (`eval()`, `no_grad`)",
    "eval_loop_interrupt": "evaluation loop over batches, KeyboardInterrupt mid-loop (every batch that ran kept)",
    "ddp": "DDP on 2 gloo processes (`%%nndebug --distributed`)",
    "every": "`--every 3` (sampled steps)",
    "continue": "`--continue run1` across two cells",
    "break_nonfinite": "`--break-on nonfinite` (NonFiniteError at the first Inf)",
    "interrupt_loop": "KeyboardInterrupt mid-loop (history kept)",
    "interrupt_loop_forward": "KeyboardInterrupt inside `forward` mid-loop (history kept)",
    "grad_accum": "gradient accumulation (2 micro-batches per optimizer step)",
    "grad_accum_opt": "gradient accumulation, `step_on=\"optimizer\"` (micro-batches merged)",
    "two_optimizers_opt": "two optimizers stepped after each backward, `step_on=\"optimizer\"` (one step)",
    "interrupt_accum_opt": "KeyboardInterrupt mid-accumulation, `step_on=\"optimizer\"` (the open step kept)",
    "parametrized": "parametrized layers (`weight_norm`)",
    "double_backward": "gradient penalty (`autograd.grad(create_graph=True)`)",
    "frozen": "frozen model (`requires_grad_(False)`)",
    "inplace_relu": "`ReLU(inplace=True)`",
    "nonsquare": "non-square images (8×12)",
    "kwargs_call": "model called with keywords (`model(x=x)`)",
    "inputs_embeds": "`model(inputs_embeds=...)` (no token ids)",
    "tuple_output": "`return_dict=False` (tuple outputs)",
    "padded": "padded batch (`attention_mask`, `--seq-index 1`)",
    "input_grad": "input with `requires_grad` (saliency)",
    "budget0": "`--max-bytes 0` (nothing kept beyond stats)",
    "del_model": "`del model` afterwards (freed)",
    "interrupt_mid": "KeyboardInterrupt mid-grid / mid-attribution / mid-`generate()` (API)",
    "exception_mid": "exception mid-grid / mid-attribution / in the `with` block (API)",
    "not_applicable": "view does not apply (MLP / CNN)",
    "reruns": "100 re-runs of the cell",
}


#: the docs page's few words for a note: (pattern found in the view's note, what the page shows);
#: the first match wins, a note matching none is shown as written (cut at 70 characters)
SHORT: list[tuple[str, str]] = [
    ("is a TorchScript module", "TorchScript: hooks cannot see inside"),
    ("graph exported by torch.export", "exported graph: hooks cannot see its layers"),
    ("no layer fits the memory budget", "budget keeps no map"),
    ("the cell was interrupted", "interrupted, re-run"),
    ("has a spatial output", "no spatial layer"),
    ("is an encoder", "not a causal LM"),
    ("could not find the list of transformer blocks", "not a transformer"),
    ("raised before any layer produced an output", "the model raised first"),
    ("the model raised", "the model raised"),
    ("was not called with token ids", "no token ids"),
]


def cut(note: str) -> str:
    """A note as the full table shows it: at most 70 characters, no ``|``."""
    return (note if len(note) <= 70 else note[:69] + "…").replace("|", "/")


def short(note: str) -> str:
    """A note in the docs page's few words (``SHORT``), or cut as in the full table."""
    return next((words for pattern, words in SHORT if pattern in note), cut(note))


def merge(marks: list[str], brief: bool = False) -> str:
    """One table cell from the outcomes of its tests: ``—`` none ran, ``✓`` all checked, ``✗`` all
    failed, ``partly (…)`` some failed, else ``note: …`` (each distinct note once, sorted)."""
    if not marks:
        return "—"
    if all(m == "✓" for m in marks):
        return "✓"
    if any(m == "✗" for m in marks):
        return "✗" if all(m == "✗" for m in marks) else "partly (" + ", ".join(sorted(set(marks))) + ")"
    words = short if brief else cut
    return "note: " + "; ".join(sorted({words(m) for m in marks if m != "✓"}))


def cells_of(outcomes: dict[tuple[str, str], str]) -> dict[tuple[str, str], list[str]]:
    """(mode, column) → the outcomes of that cell's tests (``all[cnn]``, ``all[gpt2]`` … are column ``all``)."""
    cells: dict[tuple[str, str], list[str]] = {}
    for (mode, view), mark in sorted(outcomes.items()):
        cells.setdefault((mode, view.split("[")[0]), []).append(mark)
    return cells


def table_lines(outcomes: dict[tuple[str, str], str], brief: bool = False) -> list[str]:
    """The table's markdown lines (header first); a mode whose every cell is ``—`` has no row."""
    cells = cells_of(outcomes)
    lines = ["| mode | " + " | ".join(VIEWS) + " |", "| --- | " + " | ".join("---" for _ in VIEWS) + " |"]
    for mode, label in LABELS.items():
        row = [merge(cells.get((mode, v), []), brief) for v in VIEWS]
        if any(c != "—" for c in row):
            lines.append(f"| {label} | " + " | ".join(row) + " |")
    return lines


def full_page(outcomes: dict[tuple[str, str], str]) -> str:
    """``tests/envelope/WORKS_WITH.md``: the table with each note as the view wrote it."""
    return "\n".join([
        "# Works with",
        "",
        "Generated from `tests/envelope` (the real-use matrix): ✓ the view is correct in that mode,",
        "`note: …` the view is replaced by that one-line note, ✗ not yet (a strict xfail in the matrix),",
        "— not applicable; `all`: every view at once (`--view all`), each as correct as alone. Language views were run on tiny GPT-2 and Llama models (attention also on a BERT encoder).",
        "The same table with each note in a few words: `docs/works-with.md`. Every run of the tier compares both with its outcomes.",
        "",
        *table_lines(outcomes),
    ]) + "\n"


def docs_page(outcomes: dict[tuple[str, str], str], page: str) -> str:
    """``page`` (the text of ``docs/works-with.md``) with the table between ``BEGIN`` and ``END`` rewritten."""
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + "\n" + "\n".join(table_lines(outcomes, brief=True)) + "\n" + END + tail


def committed_table(text: str, docs: bool) -> list[str]:
    """The table lines of a committed copy (``docs``: only those between ``BEGIN`` and ``END``)."""
    if docs:
        if BEGIN not in text or END not in text:
            return []
        text = text.split(BEGIN, 1)[1].split(END, 1)[0]
    return [line for line in text.splitlines() if line.startswith("| ")]


def parse(lines: Iterable[str]) -> dict[tuple[str, str], str]:
    """(row label, column) → cell text of a markdown table in this format."""
    cells: dict[tuple[str, str], str] = {}
    for line in lines:
        parts = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if parts[0] in ("mode", "---") or len(parts) != len(VIEWS) + 1:
            continue
        cells.update({(parts[0], v): c for v, c in zip(VIEWS, parts[1:])})
    return cells


@dataclass
class Comparison:
    """What one run's outcomes say about a committed copy of the table.

    ``downgrades``: a cell committed as ✓ whose test now ended in a note or failed: the table claims
    more than the matrix shows (always a failure). ``other``: any other cell whose outcome the copy does
    not show (a new cell, a changed note, an unlabelled mode). ``diff``: on a run of the whole tier, the
    table this run makes against the committed one, line by line (empty when equal)."""

    name: str
    downgrades: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    diff: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.downgrades or self.other or self.diff)


def compare(outcomes: dict[tuple[str, str], str], committed: list[str], name: str, brief: bool, whole: bool) -> Comparison:
    """Check this run's ``outcomes`` against the ``committed`` table lines of ``name``.

    Each outcome must agree with its committed cell, which works on any subset of the tier (``-k``, one
    file): a ✓ needs a ✓ cell or a note cell (a cell's notes may come from other variants, e.g. ``all[gpt2]``
    next to ``all[cnn]``), a note needs a note cell listing it, a failure needs ``✗``/``partly``. With
    ``whole`` (every test of the tier ran), the generated table must equal the committed one exactly.
    """
    cmp = Comparison(name)
    table = parse(committed)
    order = {mode: i for i, mode in enumerate(LABELS)}
    for (mode, col), marks in sorted(cells_of(outcomes).items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0])):
        label = LABELS.get(mode)
        if label is None:
            cmp.other.append(f"mode {mode!r} has no row label in tests/envelope/works_with.py LABELS")
            continue
        cell = table.get((label, col), "—")
        # the cell's notes joined by "; " (a note may hold "; " itself: look for it between separators)
        notes = f"; {cell.removeprefix('note: ')}; " if cell.startswith("note: ") else ""
        for mark in marks:
            shown = "✗" if mark == "✗" else "✓" if mark == "✓" else (short if brief else cut)(mark)
            if cell == "✓" and shown != "✓":
                cmp.downgrades.append(f"{label} × {col}: committed ✓, this run: {'failed' if shown == '✗' else 'note: ' + shown}")
            elif shown == "✓":
                if not (cell == "✓" or notes):
                    cmp.other.append(f"{label} × {col}: committed {cell!r}, this run: ✓")
            elif shown == "✗":
                if not (cell == "✗" or cell.startswith("partly")):
                    cmp.other.append(f"{label} × {col}: committed {cell!r}, this run: failed")
            elif f"; {shown}; " not in notes:
                cmp.other.append(f"{label} × {col}: committed {cell!r}, this run: note: {shown}")
    if whole:
        made = table_lines(outcomes, brief)
        if made != committed:
            cmp.diff = list(difflib.unified_diff(committed, made, f"{name} (committed)", f"{name} (this run)", lineterm="", n=0))
    return cmp


def report(comparisons: list[Comparison], whole: bool, written: bool, limit: int = 40) -> list[str]:
    """The lines the terminal summary shows (empty when every copy agrees; at most ``limit`` per copy,
    the ✓ that became something else first)."""
    lines: list[str] = []
    for cmp in comparisons:
        if cmp.ok:
            continue
        lines.append(f"{cmp.name}: {'rewritten from this run; ' if written else ''}differs from the matrix's outcomes")
        found = [f"  ✓ became: {d}" for d in cmp.downgrades] + [f"  {o}" for o in cmp.other]
        found += [f"  {d}" for d in cmp.diff if not d.startswith(("---", "+++", "@@"))]
        found = list(dict.fromkeys(found))  # one line per cell, however many of its variants ran
        lines += found[:limit] + ([f"  … and {len(found) - limit} more"] if len(found) > limit else [])
    if lines:
        lines.append("A ✓ that became a note or a failure fails this run. If the new outcome is right, rewrite both copies "
                     "from a run of the whole tier, NBDEBUG_WORKS_WITH=1 pytest tests/envelope, and review the diff.")
    if lines and not whole:
        lines.append("(Part of the tier ran: only the cells that ran were compared.)")
    return lines


def rewrite(outcomes: dict[tuple[str, str], str], full: Path = FULL, docs: Path = DOCS) -> None:
    """Write both committed copies from ``outcomes`` (a run of the whole tier)."""
    full.write_text(full_page(outcomes))
    docs.write_text(docs_page(outcomes, docs.read_text()))


def check(outcomes: dict[tuple[str, str], str], whole: bool, write: bool,
          full: Path = FULL, docs: Path = DOCS) -> tuple[bool, list[str]]:
    """Compare ``outcomes`` with both committed copies (then rewrite them when ``write`` and ``whole``);
    returns (whether the run passes, the summary lines).

    Without ``write`` any disagreement fails. With ``write`` a run of the whole tier rewrites both
    copies and still fails when a committed ✓ became a note or a failure (so it is seen once, loudly);
    part of the tier writes nothing and fails."""
    comparisons = [
        compare(outcomes, committed_table(full.read_text(), docs=False), "tests/envelope/WORKS_WITH.md", False, whole),
        compare(outcomes, committed_table(docs.read_text(), docs=True), "docs/works-with.md", True, whole),
    ]
    lines = report(comparisons, whole, write and whole)
    if write and whole:
        rewrite(outcomes, full, docs)
        lines.append("NBDEBUG_WORKS_WITH: rewrote tests/envelope/WORKS_WITH.md and the table in docs/works-with.md.")
    elif write:
        lines.append("NBDEBUG_WORKS_WITH: nothing written: only part of the tier ran (run all of tests/envelope).")
    if write:
        passed = whole and not any(c.downgrades for c in comparisons)
    else:
        passed = all(c.ok for c in comparisons)
    return passed, lines
