"""What a view's clicks run again, one session per kind of click, each holding the model weakly (a
:class:`~nbdebug.capture.weak.ModelRef`: after ``del model`` a click answers with the
``ModelGoneError`` message) and typed for its widget by a :mod:`.protocols` ``Protocol``.

Made by a recorder after the cell ran, handed to the widget; sessions import nothing from
``recorders/`` or ``widgets/`` (``tests/unit/test_architecture.py``). Their forwards are nbdebug's own
(:mod:`nbdebug.runs`).
"""
