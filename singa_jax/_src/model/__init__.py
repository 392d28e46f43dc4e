"""SINGA's ``Model``: compile, train/eval, the step it runs (eager or graph mode, a transaction),
checkpoints in SINGA's format, the functional view, and SINGA 3.0's ``Module``."""
