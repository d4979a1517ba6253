"""The view registry: what `%%nndebug --view NAME` and the Python API can show.

A view is a :class:`Recorder` subclass living in ``nbdebug/recorders/<name>.py``: it is entered
around the user's code (install hooks, switch attention implementations, remember inputs...),
restores everything on exit (also on exceptions and KeyboardInterrupt), then turns what it saw into
plain data (``result()``, an inspector's dataclass, handed back by ``-o VAR``) and a widget
(``widget()``). The magic adds each view's ``arguments`` to its own, so ``%%nndebug?`` documents
every option, and knows nothing else about views.
"""

from __future__ import annotations

import ast
import difflib
import dis
import importlib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .capture.weak import ModelRef

__all__ = ["VIEWS", "NotApplicableError", "Recorder", "ViewSpec", "get_recorder", "training_options"]


class NotApplicableError(Exception):
    """Raised by a recorder's constructor when its view cannot apply to this model at all (attention
    on a CNN): the view becomes a one-line note and the other views run. Bad option values stay
    ``ValueError``/``LookupError`` (a ``UsageError`` in the magic, before the cell runs).
    """


class Recorder:
    """Base class of a view's recorder. Subclasses override ``__enter__``/``__exit__``/``result``/``widget``.

    ``options`` holds the parsed magic arguments (or Python keyword arguments) by their ``dest``
    names; a recorder reads only its own and ignores the rest.

    ``self.model`` reads like an attribute but is held weakly: after ``del model`` it raises
    :class:`~nbdebug.capture.weak.ModelGoneError` (its message says to re-run the cell) instead of
    keeping the model and its memory alive.
    """

    def __init__(self, model: nn.Module, **options: Any) -> None:
        self.model = model
        self.options = options

    @property
    def model(self) -> nn.Module:
        """The user's model while it exists (``ModelGoneError`` once it has been deleted)."""
        return self._model_ref.get()

    @model.setter
    def model(self, model: nn.Module) -> None:
        self._model_ref: ModelRef[nn.Module] = ModelRef(model)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def applies(self) -> str | None:
        """After the run, before :meth:`widget`: ``None`` when the view has something to show, else a
        one-line reason ("no captured layer has a spatial output"). Called before any widget is
        created, so a view that does not apply never creates (and closes) a front-end model.
        """
        return None

    def result(self) -> Any:
        """Plain data describing what was captured (dataclasses holding numpy arrays)."""
        raise NotImplementedError

    def widget(self) -> Any:
        """The anywidget that shows :meth:`result`."""
        raise NotImplementedError


@dataclass(frozen=True)
class ViewSpec:
    """One view: its name, a line of help, its extra magic arguments, and where its recorder lives."""

    name: str
    help: str
    recorder: str  # "module:Class", imported on first use
    # Extra magic arguments as (flags, argparse kwargs); dest names must be unique across views.
    arguments: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = field(default=())
    # False: the view needs inputs only the user can give (patching: --corrupt, --answer), so
    # `--view all` ("every view that applies") leaves it out; it runs when named.
    in_all: bool = True


VIEWS: dict[str, ViewSpec] = {}


def register(spec: ViewSpec) -> ViewSpec:
    VIEWS[spec.name] = spec
    return spec


def get_recorder(name: str) -> type[Recorder]:
    spec = VIEWS[name]
    module, _, cls = spec.recorder.partition(":")
    return getattr(importlib.import_module(module), cls)


register(
    ViewSpec(
        name="thermometer",
        help="per-layer activation and gradient health (dead units, NaN/Inf origin, vanishing/exploding gradients)",
        recorder="nbdebug.recorders.thermometer:ThermometerRecorder",
        arguments=(
            (("--histograms",), dict(action="store_true", help="keep a 32-bin histogram of every layer's output up front (otherwise fetched on click)")),
            (("--dead-threshold",), dict(type=float, default=None, dest="dead_threshold", help="fraction of exact zeros that makes a layer dead (default 0.99)")),
            (("--every",), dict(type=int, default=None, dest="every", metavar="N", help="training loops: keep every N-th step in the history, plus the last and the first non-finite one (default 1: every step); the NaN/Inf check still runs on every step")),
            (("--loss",), dict(default=None, dest="loss_var", metavar="NAME", help="variable holding the step's loss, read as each step ends, e.g. --loss loss (default: the model's output when it is a scalar or has .loss)")),
            (("--break-on",), dict(default=None, dest="break_on", choices=["nonfinite"], help="raise nbdebug.NonFiniteError at the first NaN/Inf forward output so %%debug opens in that module's call (what was recorded is still shown); may sync once per module call on accelerators")),
            (("--continue",), dict(default=None, dest="continue_from", metavar="VAR", help="append this cell's steps to an earlier run: the -o VAR of an earlier %%%%nndebug cell (step numbers and history continue)")),
        ),
    )
)

register(
    ViewSpec(
        name="attention",
        help="attention heads: layers × heads grid with sink/entropy/previous-token metrics, a head's full matrix on click, ablate the clicked heads (zero/mean) to see the effect (uses --answer/--wrong)",
        recorder="nbdebug.recorders.attention:AttentionRecorder",
        arguments=(
            (("--tokens",), dict(default=None, dest="tokens", metavar="VAR", help="variable holding the token strings (attention, logitlens)")),
            (("--tokenizer",), dict(default=None, dest="tokenizer", metavar="VAR", help="variable holding the tokenizer that made the input ids (attention, logitlens)")),
            (("--seq-index",), dict(type=int, default=0, dest="seq_index", metavar="I", help="batch item shown by attention/logitlens (default 0)")),
        ),
    )
)

register(
    ViewSpec(
        name="logitlens",
        help="logit lens: every layer's residual through the model's final norm and unembedding (uses --tokenizer/--tokens too)",
        recorder="nbdebug.recorders.logitlens:LogitLensRecorder",
        arguments=(
            (("--target-token",), dict(default=None, dest="target_token", metavar="TOKEN", help="the lens's older name of --answer (kept as an alias): the token whose probability/rank is tracked (text, id or #id; default: the next input token)")),
            (("--lens-topk",), dict(type=int, default=10, dest="lens_topk", metavar="K", help="top-k tokens kept per cell (default 10)")),
            (("--steer",), dict(default=None, dest="steer", metavar="VAR", help="steering panel: VAR holds a vector from nbdebug.steering_vector (or {layer: vector})")),
            (("--lens",), dict(default=None, dest="lens", metavar="LENS", help="logit (default), tuned, shortcut, a variable holding nbdebug.fit_lens(...), or a lens folder; two comma-separated (tuned,logit): shown, compared (steering uses the shown one)")),
        ),
    )
)


register(
    ViewSpec(
        name="featuremaps",
        help="every channel of a layer's spatial output as a tiled grid (CNNs, channels-last and ViT token grids)",
        recorder="nbdebug.recorders.featuremaps:FeatureMapsRecorder",
        arguments=(
            (("--sample",), dict(type=int, default=None, dest="sample", help="which sample of the batch to show first (default 0; gradcam too)")),
            (("--colormap",), dict(default=None, dest="colormap", help="(gradcam too) viridis, magma, inferno, plasma, gray, coolwarm, RdBu")),
            (("--sort",), dict(default=None, dest="fm_sort", choices=["index", "mean", "max", "sparsity"], help="channel order (default index)")),
            (("--norm",), dict(default=None, dest="fm_norm", choices=["channel", "shared"], help="contrast per channel or one scale for all (default channel)")),
        ),
    )
)

register(
    ViewSpec(
        name="gradcam",
        help="Grad-CAM and the CAM family over the input image for the top-k classes (CNNs and vision transformers), with faithfulness and sanity checks",
        recorder="nbdebug.recorders.gradcam:GradCamRecorder",
        arguments=(
            (("--layer",), dict(default=None, dest="gradcam_layer", help="target layer (default: the last one with a spatial output the scores depend on); 'name#k' for the k-th call of a shared module")),
            (("--target",), dict(default=None, dest="target", help="'topk' (default), a class index, a class name, or a comma-separated list")),
            (("--topk",), dict(type=int, default=None, dest="cam_topk", help="how many top classes to explain at once (default 5)")),
            (("--method",), dict(default=None, dest="cam_method", help="CAM method(s), comma-separated, or all: gradcam (default), gradcam++, hirescam, xgradcam, layercam, eigencam, ablationcam, scorecam (the last two run one forward per channel, batched under --max-bytes)")),
            (("--faithfulness",), dict(action="store_true", dest="faithfulness", help="gradcam: deletion/insertion and ROAD (MoRF/LeRF) curves of each method's map for sample 0 and its top class, methods ranked")),
            (("--sanity",), dict(action="store_true", dest="sanity", help="gradcam: Spearman of each map against the map with the layers after the CAM layer re-initialised (on a copy); flags maps that do not depend on the class decision")),
            (("--class-names",), dict(default=None, dest="class_names", metavar="VAR", help="a list/dict of class names in the notebook (default: model.config.id2label)")),
            (("--image-mean",), dict(default=None, dest="image_mean", help="input normalisation mean, e.g. 0.485,0.456,0.406 (default: detected)")),
            (("--image-std",), dict(default=None, dest="image_std", help="input normalisation std (default: detected)")),
            (("--reshape",), dict(default=None, dest="reshape", help="layout of the layer output: nchw, nhwc, tokens, tokens:K or tokens:K:HxW (default: detected)")),
        ),
    )
)

register(
    ViewSpec(
        name="attribution",
        help="why A, not B? each input token's contribution to logit[answer] - logit[wrong] (gradient x input, integrated gradients, occlusion), with a faithfulness curve (uses --tokenizer, --seq-index)",
        recorder="nbdebug.recorders.attribution:AttributionRecorder",
        in_all=False,
        arguments=(
            (("--answer",), dict(default=None, dest="answer", metavar="TOKEN", help="attribution, patching, attention (a clicked head's ablation), logitlens (the token tracked; alias --target-token): the answer token: text with --tokenizer (one token, e.g. ' Paris'), a token id or #id (attribution after generate(): the view also lists the generated tokens, a click explains one over its prefix)")),
            (("--wrong",), dict(default=None, dest="wrong", metavar="TOKEN", help="attribution, patching, attention: the competing token, the metric is logit[answer] - logit[wrong] (without it: the answer's log-probability, in every view and in nbdebug.patch / nbdebug.attribute)")),
            (("--attr-method",), dict(default=None, dest="attr_method", choices=["grad_x_input", "integrated_gradients", "occlusion"], help="attribution: the method shown first (default grad_x_input; the view switches on demand)")),
            (("--steps",), dict(type=int, default=None, dest="ig_steps", metavar="N", help="attribution: integrated-gradients steps (default 64)")),
            (("--fix-first",), dict(action="store_true", dest="fix_first", help="attribution: keep the first token's own embedding in the baseline (integrated gradients from zero then converges on models with a first-token sink)")),
        ),
    )
)


register(
    ViewSpec(
        name="patching",
        help="activation patching: the cell's forward is the clean run, --corrupt the corrupt prompt; a sites × positions grid of how much each patch restores --answer (against --wrong), a click shows the patched run's next tokens",
        recorder="nbdebug.recorders.patching:PatchingRecorder",
        in_all=False,
        arguments=(
            (("--corrupt",), dict(default=None, dest="corrupt", metavar="VAR", help="variable holding the corrupt prompt: a string (with --tokenizer) or token ids, as many tokens as the cell's input")),
            (("--sites",), dict(default=None, dest="patch_sites", choices=["resid", "attn", "mlp", "heads"], help="the grid shown first (default resid; the others are fetched from the view)")),
        ),
    )
)

# -- the thermometer's training options → Capture keyword arguments --------------------------------
_CONTINUE_HINT = "pass the -o variable of an earlier %%nndebug cell, e.g. `%%nndebug model -o run` then `--continue run`"


def training_options(options: Mapping[str, Any], user_ns: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``Capture`` keyword arguments (``every``, ``loss``, ``break_on``, ``resume``, ``step_on``) from the
    thermometer's options, checked before the cell runs: a bad value is a ``ValueError`` saying what
    to write (the magic shows it as a ``UsageError``).

    Reads ``every`` (int ≥ 1), ``loss_var`` (``--loss NAME``: a variable, dotted paths allowed, read
    from ``user_ns`` each time the loss is asked for) or ``loss`` (Python: a function returning the
    loss), ``break_on`` (None | "nonfinite"), ``continue_from`` (``--continue VAR``: the name of an
    earlier cell's result, or the result itself from Python; ``resume`` too) and ``step_on``
    ("forward" | "optimizer"). ``user_ns`` defaults to ``options["user_ns"]`` (the magic puts it there,
    and the cell's source in ``options["cell"]``: a ``--loss`` name neither defined nor assigned by the
    cell is an error).

    >>> training_options({"every": 10, "break_on": "nonfinite"})["every"]
    10
    """
    ns = options.get("user_ns") if user_ns is None else user_ns
    every = options.get("every")
    if every is None:
        every = 1
    elif isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"--every takes a positive number of steps, e.g. --every 10 (got {every!r})")
    loss = options.get("loss")
    name = options.get("loss_var")
    if name is not None:
        parts = str(name).split(".")
        if not all(p.isidentifier() for p in parts):
            raise ValueError(f"--loss takes the name of the variable holding the loss, e.g. --loss loss (got {name!r})")
        if ns is None:
            raise ValueError("--loss NAME reads a notebook variable; from Python pass loss=lambda: <the loss>")
        _check_loss_name(parts[0], ns, options.get("cell"))
        loss = _reader(ns, parts)
    elif loss is not None and not callable(loss):
        raise ValueError("loss= takes a function returning the step's loss, e.g. loss=lambda: loss")
    break_on = options.get("break_on")
    if break_on not in (None, "nonfinite"):
        raise ValueError(f"--break-on takes nonfinite (got {break_on!r})")
    step_on = options.get("step_on")
    step_on = "forward" if step_on is None else step_on
    if step_on not in ("forward", "optimizer"):
        raise ValueError(f"step_on takes 'forward' or 'optimizer' (got {step_on!r})")
    cont = options.get("continue_from")
    cont = options.get("resume") if cont is None else cont
    return {"every": every, "loss": loss, "break_on": break_on, "resume": None if cont is None else _resume(cont, ns),
            "step_on": step_on}


def _check_loss_name(head: str, ns: Mapping[str, Any], cell: str | None) -> None:
    """``--loss NAME`` names a variable the notebook has or the cell assigns (``cell``: its Python
    source, given by the magic); anything else would give a loss series of NaN, so it stops here."""
    if head in ns or cell is None:
        return
    try:
        tree = ast.parse(cell)
    except SyntaxError:
        return  # the magic reports the cell's own syntax error
    assigned = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                       and not n.id.startswith("_")})
    declared = {g for n in ast.walk(tree) if isinstance(n, ast.Global) for g in n.names}
    if head in assigned or head in declared or _a_function_sets(head, ns):
        return
    close = difflib.get_close_matches(head, assigned, n=1)
    hint = f"did you mean --loss {close[0]}? " if close else ""
    names = f"the cell assigns: {', '.join(assigned[:12])}" if assigned else "the cell assigns no variable"
    raise ValueError(f"--loss {head}: no variable {head!r} in the notebook and the cell never assigns one; "
                     f"{hint}{names}. Pass the variable holding the step's loss, e.g. --loss loss")


def _a_function_sets(name: str, ns: Mapping[str, Any]) -> bool:
    """Whether a function of the notebook assigns the global ``name`` (``global loss`` in a training
    function the cell calls): its bytecode, nested functions included, stores that global."""
    def stores(code: types.CodeType) -> bool:
        if name in code.co_names and any(i.opname == "STORE_GLOBAL" and i.argval == name for i in dis.get_instructions(code)):
            return True
        return any(stores(c) for c in code.co_consts if isinstance(c, types.CodeType))

    for obj in list(ns.values()):
        code = getattr(obj, "__code__", None)
        if isinstance(code, types.CodeType) and stores(code):
            return True
    return False


def _reader(ns: Mapping[str, Any], parts: list[str]) -> Callable[[], Any]:
    def read() -> Any:
        obj = ns.get(parts[0])
        for part in parts[1:]:
            if obj is None:
                return None
            obj = obj.get(part) if isinstance(obj, Mapping) else getattr(obj, part, None)
        return obj

    return read


def _resume(cont: Any, ns: Mapping[str, Any] | None) -> Any:
    from .capture.result import CaptureResult

    label = cont if isinstance(cont, str) else type(cont).__name__
    obj = cont
    if isinstance(cont, str):
        if not cont.isidentifier():
            raise ValueError(f"--continue takes a variable name: {_CONTINUE_HINT}")
        if ns is None or cont not in ns:
            raise ValueError(f"--continue {cont}: no variable named {cont!r}; {_CONTINUE_HINT}")
        obj = ns[cont]
    if isinstance(obj, Mapping):  # the -o of several views at once: view → result
        obj = obj.get("thermometer", obj)
    if not isinstance(obj, CaptureResult):
        raise ValueError(f"--continue {label}: that is a {type(obj).__name__}, not the result of a thermometer run; {_CONTINUE_HINT}")
    return obj
