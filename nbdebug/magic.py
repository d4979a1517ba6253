"""`%%nndebug`: run a cell under one or more nbdebug views and show them under it.

Only wiring: options → a view's recorder (nbdebug/views.py) → run the cell → display the widget.
"""

from __future__ import annotations

import ast
import hashlib
import sys
from typing import Any

import traitlets
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from torch import nn

from .api import Debug, parse_views
from .capture.budget import DEFAULT_MAX_BYTES, format_bytes, parse_bytes
from .views import VIEWS

__all__ = ["NNDebugMagics"]

RESULT_NAME = "_nndebug"
WIDGET_NAME = "_nndebug_widget"


def _nndebug_doc(fn: Any) -> Any:
    """Apply the common arguments and every registered view's arguments (so `%%nndebug?` lists them)."""
    for spec in reversed(list(VIEWS.values())):
        for flags, kwargs in reversed(spec.arguments):
            kw = dict(kwargs)
            kw["help"] = f"[{spec.name}] {kw.get('help', '')}"
            fn = argument(*flags, **kw)(fn)
    fn = argument("--max-bytes", default=None, dest="max_bytes", metavar="SIZE",
                  help="memory budget of every view for data kept beyond scalar stats (samples, histograms, "
                  "attention, feature maps), e.g. 64MB, 512KB, 1.5GB or a number of bytes; units are powers "
                  "of 2 (KB = 2^10, MB = 2^20, GB = 2^30 bytes); 0 keeps nothing beyond scalar stats "
                  f"(default: %%config NNDebugMagics.max_bytes, {format_bytes(DEFAULT_MAX_BYTES)})")(fn)
    fn = argument("-o", "--output", default=None, metavar="VAR",
                  help=f"store the captured data in VAR (always also in {RESULT_NAME}; the widget in {WIDGET_NAME})")(fn)
    fn = argument("--layers", default=None, metavar="PATTERN",
                  help="modules to capture: names, globs ('layer1.*'), 're:REGEX' or 'type:Conv2d', comma-separated; default: every leaf module")(fn)
    fn = argument("--view", default=None,
                  help="view(s), comma-separated, shown as linked tabs when several: " + ", ".join(f"{n} ({s.help})" for n, s in VIEWS.items())
                  + "; all (every view that applies to the model)")(fn)
    fn = argument("--stall", default=60.0, type=float, metavar="SECONDS",
                  help="with --distributed: say so in the cell when no rank wrote progress for this long (default 60)")(fn)
    fn = argument("--distributed", action="store_true",
                  help="the cell launches workers (torch.multiprocessing fork/spawn, accelerate's notebook_launcher, "
                  "a torchrun subprocess); each rank's `with nbdebug.debug(model):` is recorded and shown here; "
                  "no model argument (the models live in the workers)")(fn)
    fn = argument("model", nargs="?", default=None,
                  help="the nn.Module to inspect: a name in the notebook (dotted paths allowed, e.g. trainer.model)")(fn)
    return magic_arguments()(fn)


def _unquote(value: Any) -> Any:
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


@magics_class
class NNDebugMagics(Magics):
    """`%%nndebug MODEL [--view V] [--layers PATTERN] [-o VAR]`: debug a model while a cell runs.

    Defaults are configurable, e.g. ``%config NNDebugMagics.default_view = "thermometer"``.
    """

    default_view = traitlets.Unicode("thermometer", help="view used when --view is not given").tag(config=True)
    max_bytes = traitlets.Union(
        [traitlets.Int(), traitlets.Float(), traitlets.Unicode()], default_value=DEFAULT_MAX_BYTES,
        help="memory budget of every view beyond scalar stats: bytes or a size like '64MB' (MB = 2^20 bytes)",
    ).tag(config=True)
    sample_size = traitlets.Int(4096, help="values sampled per layer for histograms").tag(config=True)
    dead_threshold = traitlets.Float(0.99, help="fraction of exact zeros that makes an activation dead").tag(config=True)
    vanishing = traitlets.Float(1e-7, help="gradient norm below which a layer is flagged vanishing").tag(config=True)
    exploding = traitlets.Float(1e3, help="gradient norm above which a layer is flagged exploding").tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell, **kwargs)
        self._live: dict[str, list[Any]] = {}  # cell key → widgets shown by its last run

    @traitlets.validate("max_bytes")
    def _check_max_bytes(self, proposal: Any) -> int:
        try:
            return parse_bytes(proposal["value"])
        except ValueError as exc:
            raise traitlets.TraitError(f"NNDebugMagics.max_bytes: {exc}") from None

    # -- helpers ----------------------------------------------------------------------------
    def _resolve_model(self, expr: str) -> nn.Module:
        ns = self.shell.user_ns
        head, *rest = expr.split(".")
        if not head.isidentifier() or not all(p.isidentifier() for p in rest):
            raise UsageError(f"%%nndebug: {expr!r} is not a variable name; pass the model's name, e.g. `%%nndebug model`.")
        if head not in ns:
            close = [k for k in ns if not k.startswith("_") and isinstance(ns[k], nn.Module)]
            hint = f" Models in this notebook: {', '.join(close[:8])}." if close else " Define the model in an earlier cell."
            raise UsageError(f"%%nndebug: no variable named {head!r}.{hint}")
        obj = ns[head]
        for i, part in enumerate(rest):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise UsageError(f"%%nndebug: {'.'.join([head, *rest[:i]])} has no attribute {part!r}.") from None
        if not isinstance(obj, nn.Module):
            raise UsageError(f"%%nndebug: {expr} is a {type(obj).__name__}, not a torch.nn.Module; pass the model itself.")
        return obj

    @staticmethod
    def _layer_filter(pattern: str | None) -> Any:
        if not pattern:
            return None
        parts = [p.strip() for p in pattern.split(",") if p.strip()]
        types = [p[5:] for p in parts if p.startswith("type:")]
        names = [p for p in parts if not p.startswith("type:")]
        if types and names:
            raise UsageError("%%nndebug: --layers takes either names/patterns or type:NAME entries, not both.")
        if types:
            classes = []
            for t in types:
                cls = getattr(nn, t, None)
                if not isinstance(cls, type):
                    raise UsageError(f"%%nndebug: --layers type:{t}: torch.nn has no module type {t!r}.")
                classes.append(cls)
            return tuple(classes)
        return names

    def _cell_key(self, cell: str) -> str:
        parent = getattr(getattr(self.shell, "kernel", None), "get_parent", lambda: {})()
        cell_id = ((parent or {}).get("metadata") or {}).get("cellId")
        return cell_id or hashlib.sha1(cell.encode()).hexdigest()

    def _compile(self, cell: str) -> tuple[Any, Any, bool]:
        """Compile the cell body like IPython would (a SyntaxError surfaces before anything runs):
        ``(statements, trailing expression or None, whether a trailing ';' silences it)``."""
        shell = self.shell
        source = shell.transform_cell(cell)
        # Registered in linecache, so tracebacks show the cell's lines like a normal cell's.
        filename = shell.compile.cache(source, shell.execution_count)
        tree = shell.compile.ast_parse(source, filename=filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = shell.compile(ast.Expression(tree.body.pop().value), filename, "eval")
        body = shell.compile(tree, filename, "exec") if tree.body else None
        # IPython looks for the `;` that silences a value in the magic's line, not in its body
        return body, last, shell.displayhook.semicolon_at_end_of_expression(source)

    def _run(self, code: tuple[Any, Any, bool]) -> Any:
        """Execute a compiled cell body; return the value of a trailing expression."""
        __tracebackhide__ = True  # tracebacks start at the user's code
        body, last, quiet = code
        ns = self.shell.user_ns
        if body is not None:
            exec(body, ns)
        if last is not None:
            value = eval(last, ns)
            return None if quiet else value
        return None

    # -- the magic --------------------------------------------------------------------------
    @_nndebug_doc
    @cell_magic
    def nndebug(self, line: str, cell: str) -> Any:
        """Run the cell, capturing what happens inside MODEL, and show the chosen view(s) under it.

        Example::

            %%nndebug model --view thermometer -o cap
            loss = criterion(model(x), y); loss.backward()

        The cell's own output and exceptions appear as without the magic; the widget is shown even
        when the cell raises (it shows what ran up to the error), then the error propagates. A view
        that does not apply to the model (attention on a CNN) or fails is one quiet line instead
        ("not shown: gradcam (...)"); the others are still shown. Bad options are a UsageError
        before the cell runs. Nothing here keeps the model alive after ``del model``.

        Live: with one view that can follow a loop (the thermometer), the widget is shown when the
        cell starts and updates while it runs (at most 4 times a second, only what is new); at the
        end the same output is refreshed with the final state (the whole history). With several
        views nothing is shown until the end (one dashboard).
        """
        __tracebackhide__ = True
        args = parse_argstring(self.nndebug, line)
        if args.distributed:
            return self._distributed(args, cell)
        if args.model is None:
            raise UsageError("%%nndebug: pass the model's name, e.g. `%%nndebug model` (or --distributed for a cell that launches workers).")
        model = self._resolve_model(args.model)
        code = self._compile(cell)
        view = _unquote(args.view) or self.default_view
        try:
            parse_views(view)
        except ValueError as exc:
            raise UsageError(f"%%nndebug: {exc}") from None
        # IPython's argument parser keeps quotes: `--target-token " Paris"` means ` Paris`.
        options = {k: _unquote(v) for k, v in vars(args).items() if k not in ("model", "view", "output")}
        options["layers"] = self._layer_filter(options.get("layers"))
        options["user_ns"] = self.shell.user_ns
        options["cell"] = self.shell.transform_cell(cell)  # a --loss name the cell never assigns is an error
        options.setdefault("live", True)  # one view: shown when the cell starts, updated while it runs
        for name in ("max_bytes", "sample_size", "dead_threshold", "vanishing", "exploding"):
            if options.get(name) is None:  # 0 is a value, not "unset"
                options[name] = getattr(self, name)
        try:
            options["max_bytes"] = parse_bytes(options["max_bytes"])
        except ValueError as exc:
            raise UsageError(f"%%nndebug --max-bytes: {exc}") from None
        try:  # bad option values and unknown layer names stop here, before the cell runs
            dbg = Debug(model, view, **options)
        except (ValueError, LookupError, TypeError) as exc:
            raise UsageError(f"%%nndebug: {exc}") from None
        del model  # from here on only the user's namespace holds it (tracebacks keep this frame)

        key = self._cell_key(cell)
        for old in self._live.pop(key, []):
            try:
                old.close()  # the cell's previous widgets: free their comms and captured data
            except Exception:
                pass
        try:
            with dbg:
                self._live[key] = list(dbg.live_widgets)  # closed on re-run even if showing fails
                value = self._run(code)
        finally:
            self._show(dbg, key, args.output)
            del dbg  # a traceback of the cell's error must not keep the recorders (and the model)
        return value

    def _distributed(self, args: Any, cell: str) -> Any:
        """``--distributed``: run the cell with a spool for its workers, store the :class:`Run` and show
        the focus rank's thermometer with the summary; the cell's error is raised after that."""
        __tracebackhide__ = True
        from .distributed import run_distributed

        if args.model is not None:
            raise UsageError("%%nndebug --distributed takes no model: the models live in the workers; wrap their "
                             "steps in `with nbdebug.debug(model):` inside the worker function.")
        layers = [p.strip() for p in (_unquote(args.layers) or "").split(",") if p.strip()]
        if any(p.startswith("type:") for p in layers):
            raise UsageError("%%nndebug --distributed: --layers takes names or patterns here (type:NAME is not passed to workers).")
        try:
            max_bytes = parse_bytes(self.max_bytes if args.max_bytes is None else _unquote(args.max_bytes))
        except ValueError as exc:
            raise UsageError(f"%%nndebug --max-bytes: {exc}") from None
        # defaults of every worker's nbdebug.debug(...) (its own arguments win)
        options = {"layers": layers or None, "max_bytes": max_bytes, "every": getattr(args, "every", None),
                   "break_on": _unquote(getattr(args, "break_on", None))}
        code = self._compile(cell)

        def body() -> Any:
            __tracebackhide__ = True
            return self._run(code)

        run = run_distributed(body, timeout_s=args.stall, options=options)
        ns = self.shell.user_ns
        ns[RESULT_NAME] = run
        if args.output:
            ns[args.output] = run
        try:
            run.show()
        except Exception as exc:  # showing must never hide the cell's value or error
            sys.stderr.write(f"nbdebug: could not show the ranks: {type(exc).__name__}: {exc}\n")
        if run.error is not None:
            raise run.error
        return run.value

    def _show(self, dbg: Debug, key: str, output: str | None) -> None:
        """Display what applies (one dashboard when several views were asked for) and one quiet note
        for the rest; store results/widget in the namespace. Never raises: the cell's own outcome wins."""
        from IPython.display import display

        from .widgets.dashboard import ViewNote

        ns = self.shell.user_ns
        try:
            widgets = dbg.widgets()
            note = dbg.note()
            if dbg.tabbed:  # `--view all` or a list: one dashboard, tabs linked
                shown = [dbg.dashboard()] if widgets else []
                result: Any = dbg.results
            else:
                shown = widgets
                result = dbg.result if widgets else None
            live = list(dbg.live_widgets)
            self._live[key] = shown + [w for w in live if not any(w is x for x in shown)]
            ns[RESULT_NAME] = result
            ns[WIDGET_NAME] = shown[0] if shown else None
            if output:
                ns[output] = result
            for w in shown:
                if not any(w is x for x in live):  # the live widget is on screen already
                    display(w)
            dbg.settle_live()
            if note and not (dbg.tabbed and widgets):  # the dashboard shows the note itself
                display(ViewNote(note))
        except Exception as exc:  # showing the views must never hide the cell's value or error
            sys.stderr.write(f"nbdebug: could not show the view: {type(exc).__name__}: {exc}\n")
