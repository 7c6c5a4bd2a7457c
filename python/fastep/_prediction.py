"""Latent prediction in batches of test rows, shared by the GP predictors."""
import numpy as np

#: Test rows per kernel block of a prediction (a batch × n block of the test-by-train kernel).
PREDICT_BATCH = 1024


class BatchedPredictor:
    """Latent marginals at test inputs, ``batch_size`` rows at a time, so that the test-by-train
    kernel block stays small; subclasses give ``_latent_batch(X) -> (mean, var)``."""

    batch_size = PREDICT_BATCH

    def latent(self, X):
        """``(mean, var)`` of the latent function at the rows of ``X`` (variance clipped at 0)."""
        n_test = X.shape[0]
        mean = np.empty(n_test)
        var = np.empty(n_test)
        for a in range(0, n_test, self.batch_size):
            z = slice(a, min(a + self.batch_size, n_test))
            mean[z], var[z] = self._latent_batch(X[z])
        return mean, np.maximum(var, 0.0)
