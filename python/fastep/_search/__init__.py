"""The hyperparameter search shared by the GP estimators: data-aware starting values, the search space and its stopping rule, the optimisers, and the checks for a search that learnt nothing."""
