"""The fault classes and the finding codes that name each (the codes of docs/diagnosis.md; a class
may be named by more than one code only when they mean the same cause): a root finding names a class
when its code is in the set.

One place to read what the bench accepts: a fault's accepted codes are its class's, plus the few
its module adds (``also=``)."""

from __future__ import annotations

from .base import klass

__all__ = [
           "BATCH_MIXED",
           "BN_ONE",
           "BROADCAST",
           "CLIPPING",
           "DEAD",
           "EXPLODING",
           "FP16",
           "GRAPH_CUT",
           "INPUT_SCALE",
           "LR_HIGH",
           "LR_LOW",
           "NAN_BWD",
           "NAN_FWD",
           "NAN_INPUT",
           "NAN_LOSS",
           "NOT_IN_OPT",
           "NOT_ZEROED",
           "NO_STEP",
           "OUTPUT_LOSS",
           "SATURATED",
           "SCHEDULE",
           "UNRELATED",
           "UNSHUFFLED",
           "VANISHING",
           "WEIGHT_DECAY",
]

LR_HIGH = klass("lr high", "lr_high", "loss_diverged", "loss_spike")
LR_LOW = klass("lr low", "lr_low")
DEAD = klass("dead ReLU", "became_dead", "dead", "dead_units")
SATURATED = klass("saturation", "saturated")
VANISHING = klass("vanishing gradient", "vanishing", "grad_fell")
EXPLODING = klass("exploding gradient", "exploding")
NAN_FWD = klass("NaN forward", "nonfinite", "nan_origin_fwd")
NAN_BWD = klass("NaN backward", "nonfinite", "nan_origin_bwd")
NAN_INPUT = klass("NaN input", "nonfinite")
NAN_LOSS = klass("NaN in the loss", "nan_in_loss")
FP16 = klass("fp16 overflow", "nonfinite", "nan_origin_fwd")
SCHEDULE = klass("scheduler per batch", "lr_low", "lr_decayed")
CLIPPING = klass("clipping far too low", "lr_low")
BN_ONE = klass("BatchNorm one sample", "raised")
WEIGHT_DECAY = klass("weight decay too strong", "weight_decay_dominates")
NOT_ZEROED = klass("zero_grad forgotten", "grad_not_zeroed")
NO_STEP = klass("no optimizer step", "no_optimizer_step")
NOT_IN_OPT = klass("params not in the optimizer", "params_not_stepped")
GRAPH_CUT = klass("graph cut", "graph_cut")
UNRELATED = klass("inputs and labels unrelated", "loss_at_chance")
UNSHUFFLED = klass("data not shuffled", "unshuffled")
INPUT_SCALE = klass("inputs not normalised", "input_scale")
OUTPUT_LOSS = klass("output and loss disagree", "output_loss_mismatch")
BROADCAST = klass("broadcasting loss", "torch_warning")
BATCH_MIXED = klass("samples mixed across the batch", "batch_mixed")
