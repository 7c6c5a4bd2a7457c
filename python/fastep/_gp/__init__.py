"""What the Gaussian-process estimators (dense EP, sparse EP, the IVM) share: θ's packing
(``hyperparameters``), EP on one problem with its search (``problem``), the dense latent
predictive (``predictor``), argument checks (``options``), docstring pieces (``docs``) and the
estimator base and mixins (``estimator``)."""
