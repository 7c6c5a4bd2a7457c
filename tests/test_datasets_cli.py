"""Built-in data and the command-line interface."""
import io
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from fastep.cli import demo, main
from fastep.datasets import make_ivm_toy_classification


def test_ivm_toy_is_seeded_and_has_the_papers_shape():
    X, y, f = make_ivm_toy_classification(500, random_state=3)
    X2, y2, f2 = make_ivm_toy_classification(500, random_state=3)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)
    assert X.shape == (500, 2) and y.shape == (500,)
    assert X.min() >= 0.0 and X.max() <= 1.0
    assert set(np.unique(y)) == {-1.0, 1.0}
    # The latent sample has the generating GP's marginal variance (100): a loose chi-square check.
    assert 20.0 < np.var(f) < 400.0
    # Labels follow Φ(f): agreement with sign(f) is high but not perfect.
    agree = np.mean(np.sign(f) == y)
    assert 0.8 < agree < 1.0


def test_ivm_toy_latent_is_a_gp_sample_with_the_right_correlation():
    # Points close together have strongly correlated latent values (inverse width 10).
    X, _, f = make_ivm_toy_classification(400, random_state=1)
    d = np.linalg.norm(X[:, None] - X[None], axis=-1)
    close = (d < 0.05) & (d > 0)
    far = d > 0.9
    r_close = np.corrcoef(np.repeat(f[:, None], 400, 1)[close], np.repeat(f[None], 400, 0)[close])[0, 1]
    r_far = stats.pearsonr(np.repeat(f[:, None], 400, 1)[far], np.repeat(f[None], 400, 0)[far])[0]
    assert r_close > 0.9
    assert r_far < r_close - 0.3


@pytest.mark.slow
def test_demo_runs_and_reports_accuracy_evidence_time():
    out = io.StringIO()
    models = demo(n_train=200, n_test=200, out=out)
    text = out.getvalue()
    assert "log evidence" in text and "test accuracy" in text and "fit time" in text
    assert np.isfinite(models["linear"].log_marginal_likelihood_value_)
    assert models["linear"].converged_
    assert "GP classifier" in text
    for name in ("gp_fixed", "gp_learnt"):
        assert models[name].converged_
        assert np.isfinite(models[name].log_marginal_likelihood_value_)
    assert "Informative Vector Machine" in text
    assert models["ivm"].active_set_.shape == (40,) and models["ivm"].score(np.zeros((1, 2)), [1.0]) in (0.0, 1.0)
    # learning the hyperparameters cannot lower the evidence below the starting point's
    start = models["gp_learnt"].log_marginal_likelihood(np.zeros(2))
    assert models["gp_learnt"].log_marginal_likelihood_value_ >= start - 1e-6


def test_cli_entry_points():
    assert main(["demo", "--n-train", "50", "--n-test", "20"]) == 0
    res = subprocess.run([sys.executable, "-m", "fastep", "demo", "--n-train", "60", "--n-test", "30"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "test accuracy" in res.stdout
