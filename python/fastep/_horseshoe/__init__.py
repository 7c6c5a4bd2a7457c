"""Horseshoe-prior EP around the compiled engine (fastep._epcore.horseshoe_ep): one task as the estimators keep it, its predictive variances, and the type-II ML search of the hyperparameters."""
