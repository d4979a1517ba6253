"""nbdebug where training already lives: callbacks for training frameworks.

- :class:`nbdebug.TrainerCallback` (``nbdebug.integrations.hf``): Hugging Face ``transformers.Trainer``;
- :class:`nbdebug.LightningCallback` (``nbdebug.integrations.lightning``): PyTorch Lightning.

Each one runs an ``nbdebug.debug(model, view, step_on="optimizer")`` capture around the training
(one history step per optimizer step; evaluation forwards are not steps), shows the live view in
the notebook and leaves ``cb.result`` and ``cb.widget``. Neither module imports its framework
until a callback is created, so ``%load_ext nbdebug`` stays light.
"""
