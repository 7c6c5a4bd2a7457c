"""Every estimator reproduces the results recorded in ``tests/golden.npz``.

The file holds log evidences, site parameters, learnt hyperparameters and predictions
of each estimator configuration in :mod:`golden_problems` (compiled engines, reference
paths, fallbacks).  A restructuring of the code must leave them unchanged: integers
and flags exactly, floating-point values to 1e-12 relative (``python
tests/golden_problems.py --check`` reports whether they are bitwise identical).
"""
import numpy as np
import pytest

import golden_problems

GOLDEN = dict(np.load(golden_problems.GOLDEN_PATH))
PROBLEMS = golden_problems.problems()


def test_every_recorded_problem_is_still_defined():
    recorded = {key.split('/', 1)[0] for key in GOLDEN}
    assert recorded == set(PROBLEMS)


@pytest.mark.parametrize('name', sorted(PROBLEMS))
def test_results_match_the_golden_file(name):
    result = golden_problems.run(name, PROBLEMS[name])
    expected = {key.split('/', 1)[1]: value for key, value in GOLDEN.items() if key.startswith(name + '/')}
    assert sorted(result) == sorted(expected)
    for key, value in expected.items():
        got = result[key]
        assert got.shape == value.shape, key
        if value.dtype.kind in 'biu':
            np.testing.assert_array_equal(got, value, err_msg=key)
        else:
            np.testing.assert_allclose(got, value, rtol=1e-12, atol=1e-12, err_msg=key)
