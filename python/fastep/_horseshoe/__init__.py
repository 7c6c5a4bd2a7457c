"""Horseshoe-prior EP: the damped parallel loop around the compiled site step, and the type-II ML search of its hyperparameters."""
