"""Write the model files that tests/test_persistence_legacy.py loads.

Run with the fastep version whose files should stay loadable (the files here were written by
fastep 0.1.0, commit 7295e6b):

    python tests/legacy_models/write.py tests/legacy_models

Each model of test_persistence.MODELS is fitted, saved as ``<name>.npz``, and its outputs
(every prediction method on the training inputs) are stored as ``<name>.outputs.npz``.
"""
import os
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fastep                                         # noqa: E402
import test_persistence                               # noqa: E402
from test_persistence_legacy import flatten_outputs   # noqa: E402


def main(folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (model, X, y) in test_persistence.MODELS.items():
            model.fit(X, y)
            stem = os.path.join(folder, name.replace(" ", "_"))
            fastep.save(model, stem + ".npz")
            np.savez(stem + ".outputs.npz", **flatten_outputs(test_persistence._outputs(model, X, y)))


if __name__ == "__main__":
    main(sys.argv[1])
