"""Single-core training throughput of the cruise-rs apps against scikit-learn
on the same data, measured in the same run.

  python bench_throughput.py --cruise target/release/cruise --work DIR [--scale S] [apps]

cruise runs as a real job with 2 containers (1 worker + 1 server, each an
evaluator process); its throughput is records × epochs / the summary's
`train_secs` (the wall time of the training phase: first mini-batch to the
last epoch's end, pulls and pushes over loopback included). scikit-learn's is
records × epochs / the wall time of `fit` (single-threaded estimators; data
loading excluded on both sides).

  mlr    generated sparse libsvm data; cruise MLR vs SGDClassifier(loss="log_loss")
         (one-vs-rest, as scikit-learn does it), same epochs, constant step size
         0.5, no regularisation; training accuracy of both. cruise steps by the
         mean gradient of a mini-batch of 100.
  mlr1000  the same with cruise's mini-batch 1000 and step 5 (10× the step of
         the mean gradient for 10× the records: the same step per record as
         mlr). scikit-learn is the same per-record SGD as in mlr (it has no
         mini-batch), measured again in this run.
  lasso  generated dense regression data; cruise Lasso vs
         SGDRegressor(penalty="l1") with the same λ (alpha), epochs and constant
         step size; the objective 0.5·mse + λ‖w‖₁ of both.
  nmf    cruise only: observed entries per second.
  lda    cruise: tokens per second (one Gibbs sweep per epoch); scikit-learn's
         LatentDirichletAllocation (batch variational Bayes, one pass per
         iteration) is printed for reference only — a different algorithm.

Prints a table with the ratio cruise / scikit-learn. Run it on a quiet machine:
the figures are only as good as the machine is idle.

"Single-core" is the worker's: its loop (keys, compute, updates) runs on one
thread. Around it, its evaluator's runtime thread frames and sends the pulls
and pushes, and the server is another process, so the job uses more than one
core. For mlr and lasso the notes give the CPU time of both: the whole cruise
job (AM and both evaluators, start-up and loading included, an upper bound on
training's) and scikit-learn's `fit`.
"""

import argparse
import math
import os
import sys
import time

# scikit-learn single-threaded, like one cruise worker (before numpy loads).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from cruise_jobs import (Cruise, accuracy, mean_loss, read_bag_of_words,  # noqa: E402
                         read_libsvm)


def timed(f):
    t0 = time.perf_counter()
    r = f()
    return r, time.perf_counter() - t0


def cpu_timed(f):
    """f's result and the CPU seconds this process spent in it."""
    t0 = time.process_time()
    r = f()
    return r, time.process_time() - t0


def bench_mlr(c, scale, rows, batch=100, name="mlr"):
    from sklearn.linear_model import SGDClassifier

    n, f, k, nnz, epochs, step = int(50_000 * scale), 1000, 10, 40, 5, 0.5
    # cruise steps by the mini-batch's mean gradient: scale its step with the
    # batch so that every record moves the model as far as in mlr.
    our_step = step * batch / 100
    data = c.path(f"bench-mlr-{n}.libsvm")
    if not os.path.exists(data):
        c.datagen("mlr", data, samples=n, features=f, classes=k, nnz=nnz, seed=7)
    s, _ = c.run("mlr", data, epochs=epochs, mini_batch=batch, settings={
        "mlr.features": f, "mlr.classes": k, "mlr.step_size": our_step, "mlr.decay": 0.0,
        "mlr.l2": 0.0, "store.input_blocks": 8,
    })
    ours = s["records"] * epochs / s["train_secs"]
    job_cpu = c.last_cpu_secs
    X, y = read_libsvm(data, f)
    sk = SGDClassifier(loss="log_loss", penalty=None, learning_rate="constant", eta0=step,
                       max_iter=epochs, tol=None, shuffle=False, random_state=0)
    (_, fit_cpu), secs = timed(lambda: cpu_timed(lambda: sk.fit(X, y)))
    theirs = n * epochs / secs
    rows.append((name, "records/s", ours, theirs,
                 f"mini-batch {batch}; train accuracy cruise {accuracy(s['final_stats']):.4f}, "
                 f"sklearn {sk.score(X, y):.4f}; "
                 f"CPU s: cruise job {job_cpu:.2f} (train {s['train_secs']:.2f} s wall), "
                 f"sklearn fit {fit_cpu:.2f}"))


def bench_lasso(c, scale, rows):
    from sklearn.linear_model import SGDRegressor

    n, f, support, noise, lam, epochs, step, batch = int(20_000 * scale), 100, 10, 0.5, 0.05, 5, 0.01, 100
    data = c.path(f"bench-lasso-{n}.libsvm")
    if not os.path.exists(data):
        c.datagen("lasso", data, samples=n, features=f, support=support, noise=noise, seed=7)
    s, _ = c.run("lasso", data, epochs=epochs, mini_batch=batch, settings={
        "lasso.features": f, "lasso.lambda": lam, "lasso.step_size": step, "lasso.decay": 0.0,
        "store.input_blocks": 8,
    })
    ours = s["records"] * epochs / s["train_secs"]
    job_cpu = c.last_cpu_secs
    X, y = read_libsvm(data, f)
    X = X.toarray()
    sk = SGDRegressor(penalty="l1", alpha=lam, learning_rate="constant", eta0=step,
                      max_iter=epochs, tol=None, shuffle=False, random_state=0)
    (_, fit_cpu), secs = timed(lambda: cpu_timed(lambda: sk.fit(X, y)))
    theirs = n * epochs / secs
    obj = 0.5 * np.mean((y - sk.predict(X)) ** 2) + lam * np.abs(sk.coef_).sum()
    rows.append(("lasso", "records/s", ours, theirs,
                 f"objective cruise {mean_loss(s['final_stats']):.4f}, sklearn {obj:.4f}; "
                 f"CPU s: cruise job {job_cpu:.2f} (train {s['train_secs']:.2f} s wall), "
                 f"sklearn fit {fit_cpu:.2f}"))


def bench_nmf(c, scale, rows):
    r, cols, rank, density, epochs = int(5000 * scale), 1000, 10, 0.1, 5
    data = c.path(f"bench-nmf-{r}.txt")
    if not os.path.exists(data):
        c.datagen("nmf", data, rows=r, columns=cols, rank=rank, density=density, noise=0.1, seed=7)
    s, _ = c.run("nmf", data, epochs=epochs, mini_batch=50, settings={
        "nmf.columns": cols, "nmf.rank": rank, "store.input_blocks": 8,
    })
    entries = s["final_stats"]["loss_terms"]
    ours = entries * epochs / s["train_secs"]
    rows.append(("nmf", "entries/s", ours, None,
                 f"{entries} entries, rank {rank}; final RMSE {math.sqrt(mean_loss(s['final_stats'])):.4f}"))


def bench_lda(c, scale, rows):
    from sklearn.decomposition import LatentDirichletAllocation

    docs, vocab, k, doc_len, epochs = int(5000 * scale), 2000, 20, 100, 5
    data = c.path(f"bench-lda-{docs}.txt")
    if not os.path.exists(data):
        c.datagen("lda", data, docs=docs, vocab=vocab, topics=k, doc_len=doc_len,
                  alpha=0.1, beta=0.01, seed=7)
    s, _ = c.run("lda", data, epochs=epochs, mini_batch=100, settings={
        "lda.vocab": vocab, "lda.topics": k, "lda.alpha": 0.1, "lda.beta": 0.01,
        "store.input_blocks": 8,
    })
    tokens = s["final_stats"]["loss_terms"]
    ours = tokens * epochs / s["train_secs"]
    X = read_bag_of_words(data, vocab)
    sk = LatentDirichletAllocation(n_components=k, doc_topic_prior=0.1, topic_word_prior=0.01,
                                   learning_method="batch", max_iter=epochs, random_state=0)
    _, secs = timed(lambda: sk.fit(X))
    theirs = X.sum() * epochs / secs
    rows.append(("lda", "tokens/s", ours, theirs,
                 f"sklearn is batch VB (reference only); perplexity cruise "
                 f"{math.exp(mean_loss(s['final_stats'])):.1f}, sklearn {sk.perplexity(X):.1f} (bound)"))


def bench_mlr1000(c, scale, rows):
    bench_mlr(c, scale, rows, batch=1000, name="mlr1000")


BENCHES = {"mlr": bench_mlr, "mlr1000": bench_mlr1000, "lasso": bench_lasso, "nmf": bench_nmf, "lda": bench_lda}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cruise", required=True)
    ap.add_argument("--work", required=True)
    # At scale 1 a cruise job trains for 0.1-0.3 s, in which its first round
    # trips (connections opening, the first pulls) weigh visibly; 4 makes
    # every run at least 0.5 s on both sides.
    ap.add_argument("--scale", type=float, default=4.0, help="data size factor (default 4)")
    ap.add_argument("apps", nargs="*", help=f"benchmarks: {' '.join(BENCHES)} (default: all)")
    a = ap.parse_args()
    unknown = [x for x in a.apps if x not in BENCHES]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}")
    c = Cruise(a.cruise, a.work)
    rows = []
    for app in a.apps or list(BENCHES):
        print(f"running {app} ...", file=sys.stderr, flush=True)
        BENCHES[app](c, a.scale, rows)
    print(f"{'app':<8} {'unit':<10} {'cruise':>12} {'sklearn':>12} {'ratio':>7}  notes")
    for app, unit, ours, theirs, note in rows:
        t = f"{theirs:12.0f}" if theirs else f"{'-':>12}"
        r = f"{ours / theirs:7.2f}" if theirs else f"{'-':>7}"
        print(f"{app:<8} {unit:<10} {ours:12.0f} {t} {r}  {note}")


if __name__ == "__main__":
    main()
