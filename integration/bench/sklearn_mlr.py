"""The scikit-learn reference of bench-mlr.

Trains SGDClassifier(loss="log_loss") on a libsvm file with a constant step,
for a fixed number of epochs, and prints one JSON object: samples/s of fit()
(loading excluded, as cruise's train_secs excludes it), training accuracy and
mean log loss.

Usage: python sklearn_mlr.py FILE FEATURES EPOCHS ETA0 ALPHA
"""

import json
import sys
import time
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import SGDClassifier
from sklearn.metrics import log_loss


def main() -> None:
    path, features, epochs, eta0, alpha = sys.argv[1:6]
    # Indices are used as they are (cruise accepts 0..=features), so both
    # sides see the same feature space.
    x, y = load_svmlight_file(path, n_features=int(features) + 1, zero_based=True)
    # SGDClassifier takes 32-bit sparse indices only.
    x = sp.csr_matrix(
        (x.data, x.indices.astype(np.int32), x.indptr.astype(np.int32)), shape=x.shape
    )
    clf = SGDClassifier(
        loss="log_loss",
        learning_rate="constant",
        eta0=float(eta0),
        alpha=float(alpha),
        max_iter=int(epochs),
        tol=None,
        shuffle=True,
        random_state=0,
    )
    warnings.simplefilter("ignore", ConvergenceWarning)
    t0 = time.perf_counter()
    clf.fit(x, y)
    secs = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "samples": x.shape[0],
                "epochs": int(epochs),
                "fit_secs": secs,
                "samples_per_sec": x.shape[0] * int(epochs) / secs,
                "accuracy": float(clf.score(x, y)),
                "log_loss": float(log_loss(y, clf.predict_proba(x))),
            }
        )
    )


if __name__ == "__main__":
    main()
