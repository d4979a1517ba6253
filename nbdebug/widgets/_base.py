"""Base class for nbdebug widgets: ES module loading, on-demand fetch (RPC), safe repr, fallback.

Every widget is a thin :class:`anywidget.AnyWidget` whose front-end lives in
``nbdebug/static/<name>.js`` (built from ``js/src/<name>.ts``). Heavy data is never synced up
front: the browser asks for it with ``rpc(model, method, params)`` (``js/src/lib/rpc.ts``) and a
method decorated with :func:`rpc` answers with plain JSON plus named binary arrays.

>>> class Echo(NBWidget):
...     _view_name_ = "thermometer"
...     @rpc("echo")
...     def _echo(self, params):
...         return {"got": params}, {"ones": [1.0, 2.0]}
"""

from __future__ import annotations

import html
import os
import pathlib
from collections.abc import Callable
from typing import Any, ClassVar

import anywidget
import traitlets

from ._export import DEFAULT_EXPORT_BYTES, build_page
from ._transport import error_text, pack_arrays

STATIC = pathlib.Path(__file__).resolve().parent.parent / "static"

Handler = Callable[[Any, dict[str, Any]], "tuple[dict[str, Any], dict[str, Any] | None]"]


def rpc(method: str) -> Callable[[Handler], Handler]:
    """Mark a widget method as the answer to browser requests named ``method``."""

    def mark(fn: Handler) -> Handler:
        fn._nbdebug_rpc = method  # type: ignore[attr-defined]
        return fn

    return mark


def _esm_for(name: str) -> pathlib.Path | str:
    path = STATIC / f"{name}.js"
    if path.exists():
        # A path is watched by anywidget for hot reload, but every widget then stays referenced by
        # the file watcher's signal forever: only do that in the dev loop (ANYWIDGET_HMR=1).
        return path if os.environ.get("ANYWIDGET_HMR") else path.read_text(encoding="utf-8")
    # A source checkout without `npm run build`: say what to do instead of rendering nothing.
    msg = f"nbdebug: front-end bundle {path.name} is missing; run `make js` (or `cd js && npm run build`)."
    return (
        "export default { render({ el }) { el.textContent = "
        + repr(msg).replace("\\'", "'")
        + "; } };"
    )


_ANYWIDGET_KEYS = frozenset({"_esm", "_css", "_anywidget_id"})


def _class_trait(cls: type, name: str, value: str) -> None:
    """A synced Unicode trait ``name`` with default ``value`` on ``cls`` while it is being created
    (from ``__init_subclass__``: traitlets' metaclass then registers it like one of the class body)."""
    trait = traitlets.Unicode(value).tag(sync=True)
    setattr(cls, name, trait)
    trait.class_init(cls, name)


class NBWidget(anywidget.AnyWidget):
    """Common base: subclasses set ``_view_name_`` (the JS entry) and define ``@rpc`` handlers."""

    _view_name_: ClassVar[str] = ""
    _rpc_handlers: ClassVar[dict[str, str]] = {}

    #: Last error the front-end reported (rendering or fetch), for debugging from Python.
    js_error = traitlets.Unicode("").tag(sync=True)
    #: The view's finding in one sentence, computed in Python from the data under it (shown first by
    #: the front-end and in the static fallback); "" where the view has nothing to say.
    headline = traitlets.Unicode("").tag(sync=True)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Only classes that name their view get an ES module (ipywidgets' add_traits also subclasses
        # dynamically; those must keep the trait). Set before anywidget's hook, which turns a path
        # into watched FileContents (ANYWIDGET_HMR=1 reloads on rebuild).
        if "_view_name_" in cls.__dict__ and cls._view_name_:
            esm = _esm_for(cls._view_name_)
            if isinstance(esm, str):
                # The module text and anywidget's id as class traits: anywidget then adds no trait per
                # instance except an equal id, which add_traits drops (see there).
                _class_trait(cls, "_esm", esm)
                _class_trait(cls, "_anywidget_id", f"{cls.__module__}.{cls.__name__}")
            else:
                cls._esm = esm  # a watched path (ANYWIDGET_HMR=1): anywidget's own per-instance trait
        super().__init_subclass__(**kwargs)
        handlers: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            for attr, fn in vars(klass).items():
                method = getattr(fn, "_nbdebug_rpc", None)
                if method:
                    handlers[method] = attr
        cls._rpc_handlers = handlers

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_msg(self._handle_request)

    def add_traits(self, **traits: Any) -> None:
        """Traits added to this instance, except anywidget's ``_esm``/``_css``/``_anywidget_id`` when the
        class already has that trait: ``AnyWidget.__init__`` passes its id to every new widget, and
        adding a trait makes traitlets create a new class for the instance (~0.3 ms each, in the cell's
        time). Such a trait's value is set instead when it differs (a subclass of a view: its own id)."""
        cls, rest = type(self), {}
        for k, v in traits.items():
            own = getattr(cls, k, None) if k in _ANYWIDGET_KEYS else None
            if isinstance(own, traitlets.Unicode) and type(v) is type(own):
                if v.default_value != own.default_value:
                    self.set_trait(k, v.default_value)
            else:
                rest[k] = v
        if rest:
            super().add_traits(**rest)

    def close(self) -> None:
        """Close the widget and its Layout child (ipywidgets leaves the Layout's comm open)."""
        layout = self._trait_values.get("layout")
        super().close()
        if layout is not None:
            layout.close()

    # -- on-demand fetch -------------------------------------------------------------------
    def handle_request(self, method: str, params: dict[str, Any]) -> tuple[dict, list]:
        """Answer one request as ``(content, buffers)``; also usable from tests without a browser."""
        name = self._rpc_handlers.get(method)
        if name is None:
            raise KeyError(f"unknown request {method!r}; known: {sorted(self._rpc_handlers)}")
        result, arrays = getattr(self, name)(params or {})
        return pack_arrays({"result": result}, arrays)

    def _handle_request(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict) or content.get("type") != "request":
            return
        rid = content.get("id")
        try:
            body, buffers = self.handle_request(str(content.get("method")), content.get("params"))
            self.send({"type": "response", "id": rid, "ok": True, **body}, buffers)
        except Exception as exc:  # errors go back to the browser as data
            self.send({"type": "response", "id": rid, "ok": False, "error": error_text(exc)})

    # -- what saved notebooks and plain terminals see -----------------------------------------
    def fallback_html(self) -> str:
        """Static HTML shown where the live widget cannot render; subclasses override."""
        return f"<pre>{html.escape(repr(self))}</pre>"

    def safe_fallback_html(self) -> str:
        """:meth:`fallback_html`, or one line saying why there is none (e.g. the model was deleted and
        the snapshot needed it): displaying a widget never raises."""
        try:
            return self.fallback_html()
        except Exception as exc:
            return f"<pre class='nbdebug-note'>{html.escape(repr(self))}: no static snapshot ({html.escape(error_text(exc))})</pre>"

    # -- standalone export -------------------------------------------------------------------
    def export_requests(self) -> list[tuple[str, dict[str, Any]]]:
        """Requests ``(method, params)`` whose answers :meth:`save_html` precomputes; subclasses override."""
        return []

    def export_html(self, *, max_bytes: int = DEFAULT_EXPORT_BYTES, title: str | None = None) -> str:
        """The standalone offline HTML page of the current view (see :meth:`save_html`)."""
        esm_path = STATIC / f"{self._view_name_}.js"
        if not esm_path.exists():
            raise FileNotFoundError(f"{esm_path} is missing; run `make js` (or `cd js && npm run build`)")
        state = {k: v for k, v in self.get_state().items() if not k.startswith("_") and k != "layout"}
        answers: list[tuple[str, dict[str, Any], Any]] = []
        for method, params in self.export_requests():
            try:
                answers.append((method, params, self.handle_request(method, params)))
            except Exception as exc:  # exported as the error the kernel would have sent
                answers.append((method, params, exc))
        page, _omitted = build_page(esm=esm_path.read_text(encoding="utf-8"), state=state, answers=answers,
                                    title=title or f"nbdebug {self._view_name_}", max_bytes=max_bytes)
        return page

    def save_html(self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_EXPORT_BYTES,
                  title: str | None = None) -> pathlib.Path:
        """Write a standalone HTML file of the current view that opens offline, without a kernel.

        The widget's ES module and synced state are inlined; the answers to :meth:`export_requests`
        are precomputed (up to ``max_bytes`` in all; the page says what was left out).

        >>> w.save_html("thermometer.html")        # doctest: +SKIP
        """
        out = pathlib.Path(path)
        out.write_text(self.export_html(max_bytes=max_bytes, title=title), encoding="utf-8")
        return out

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        if isinstance(bundle, tuple):
            data, meta = bundle
        else:
            data, meta = bundle, {}
        if data is None:
            return bundle
        data = dict(data)
        data["text/html"] = self.safe_fallback_html()
        data["text/plain"] = repr(self)
        return data, meta

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
