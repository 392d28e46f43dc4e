"""Eager replay: recurring sequences of eager kernel calls recorded and run as one compiled
program. Knows no operator: callers hand it a kernel and its static arguments."""
