"""Graph mode: a call traced once and compiled as one XLA program (state found, donated and
written back), with the trace hook that finds the state and the transaction that undoes a
failed call."""
