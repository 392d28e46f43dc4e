"""A training run on disk: what a run needs to continue exactly (:mod:`.run_state`) and the
checkpoints that hold it, written in the background and kept N at a time (:mod:`.manager`)."""
