"""Every forward nbdebug runs itself (not the user's run, which ``capture/`` watches).

Layout: ``own`` (:func:`own_pass`: the one set-up of an own forward: buffers cloned, RNG forked, the
user's hooks set aside, grad mode), ``points`` (:class:`Point`: module, input/output, which call;
:class:`CallCounter`; :class:`Stopped`), ``interventions`` (the hooks that edit, patch and read
activations, composing in any order), ``run`` (:func:`run`: one own forward with edits and reads as
arguments, stopped early on request), ``patchrun`` (the workbench's recorded runs), ``gradients`` and
``perturb`` (the CAM family's passes), ``replay`` and ``attention_probe`` (the language views' extra
forwards). The activation at a point is read and replaced by :mod:`nbdebug.capture.leaves`.
``runs`` imports nothing above it: only ``capture`` and ``adapters``.
"""

from .own import own_pass
from .points import CallCounter, Point, Stopped
from .run import RunResult, run

__all__ = ["CallCounter", "Point", "RunResult", "Stopped", "own_pass", "run"]
