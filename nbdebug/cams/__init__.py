"""Class-activation maps on a vision model's own passes: the CAM methods (:mod:`.methods`: Grad-CAM
and its gradient siblings, :func:`~nbdebug.cams.methods.compute_cams`, the per-layer cache the
Grad-CAM view's clicks read), the perturbation methods' batched forwards (:mod:`.perturb`) and the
checks of a map (:mod:`.checks`: ``--faithfulness``, ``--sanity``). Pure of widgets: the Grad-CAM view
(:mod:`nbdebug.recorders.gradcam`) and the channel ablation session use it.
"""
