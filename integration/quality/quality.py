"""Correctness of the cruise-rs apps against scikit-learn and known ground
truths, with real `cruise run` jobs (an AM and evaluator processes on the
local runtime: 1 worker + 1 server).

  python quality.py --cruise target/release/cruise --work DIR [mlr lasso nmf lda]

Checks (each prints its figures; the script exits 1 if any fails):
  mlr    scikit-learn's digits, 75/25 stratified split exported to libsvm:
         held-out accuracy (`--eval-input`) within 2 points of
         LogisticRegression's.
  lasso  generated sparse regression: coefficients (`--model-out`) within 5 %
         relative error of sklearn.linear_model.Lasso at the same penalty,
         coefficient by coefficient on the support, and the same support.
  nmf    generated low-rank matrix plus noise: training RMSE within 10 % of
         the noise actually added; all factors non-negative.
  lda    generated corpus: the log-likelihood rises after burn-in; the
         recovered topics match the true ones (mean best-match cosine >= 0.9);
         scikit-learn LatentDirichletAllocation's perplexity on the same
         corpus is reported beside ours.
"""

import argparse
import math
import sys
import time

import numpy as np

from cruise_jobs import (Cruise, Report, accuracy, mean_loss, read_bag_of_words,
                         read_libsvm, read_model)


def check_mlr(c, rep):
    from sklearn.datasets import dump_svmlight_file, load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    train, test = c.path("digits.train.libsvm"), c.path("digits.test.libsvm")
    dump_svmlight_file(Xtr, ytr, train, zero_based=False)
    dump_svmlight_file(Xte, yte, test, zero_based=False)

    t0 = time.monotonic()
    sk = LogisticRegression(max_iter=5000).fit(Xtr, ytr)
    sk_secs = time.monotonic() - t0
    sk_acc = sk.score(Xte, yte)

    s, secs = c.run("mlr", train, epochs=30, mini_batch=20, eval_input=test, settings={
        "mlr.features": 64, "mlr.classes": 10, "mlr.step_size": 1.0,
        "mlr.decay": 0.1, "mlr.l2": 0.0, "store.input_blocks": 4,
    })
    ours = accuracy(s["eval_stats"])
    rep.figure("digits train / test records", f"{len(ytr)} / {len(yte)}")
    rep.figure("cruise train accuracy", f"{accuracy(s['final_stats']):.4f}")
    rep.figure("cruise test log-loss", f"{mean_loss(s['eval_stats']):.4f}")
    rep.figure("cruise job wall / training secs", f"{secs:.2f} / {s['train_secs']:.2f}")
    rep.figure("sklearn LogisticRegression fit secs", f"{sk_secs:.2f}")
    rep.check("mlr test accuracy within 2 points", ours >= sk_acc - 0.02,
              f"cruise {ours:.4f} vs sklearn {sk_acc:.4f} (diff {100 * (ours - sk_acc):+.2f} points)")


def check_lasso(c, rep):
    from sklearn.linear_model import Lasso

    features, lam = 50, 0.1
    data = c.path("lasso.libsvm")
    truth = c.datagen("lasso", data, truth=c.path("lasso.truth.json"), samples=5000,
                      features=features, support=8, noise=0.2, seed=1)
    X, y = read_libsvm(data, features)  # column j - 1 holds feature j
    X = X.toarray()
    t0 = time.monotonic()
    sk = Lasso(alpha=lam, tol=1e-10, max_iter=100_000).fit(X, y)
    sk_secs = time.monotonic() - t0

    model_path = c.path("lasso.model")
    s, secs = c.run("lasso", data, epochs=30, mini_batch=250, model_out=model_path, settings={
        "lasso.features": features, "lasso.lambda": lam, "lasso.step_size": 0.05,
        "lasso.decay": 0.1, "lasso.features_per_key": 1, "store.model_blocks": 4,
        "store.input_blocks": 4,
    })
    header, values = read_model(model_path)
    w = np.zeros(features + 2)
    for k, v in values.items():  # one row per key (features_per_key = 1)
        w[k] = v[0]
    ours, ours_b = w[1:features + 1], w[features + 1]

    def objective(coef, b):
        return 0.5 * np.mean((y - X @ coef - b) ** 2) + lam * np.abs(coef).sum()

    # Supports as 1-based feature indices.
    support_sk = {int(j) + 1 for j in np.flatnonzero(sk.coef_)}
    support_ours = {int(j) + 1 for j in np.flatnonzero(ours)}
    true_support = {int(j) + 1 for j in np.flatnonzero(np.array(truth["coef"]))}
    on = [j - 1 for j in sorted(support_sk)]
    rel = np.abs(ours[on] - sk.coef_[on]) / np.abs(sk.coef_[on])
    rep.figure("true / sklearn / cruise support sizes",
               f"{len(true_support)} / {len(support_sk)} / {len(support_ours)}")
    rep.figure("sklearn support == true support", str(support_sk == true_support))
    rep.figure("objective sklearn / cruise (0.5·mse + λ‖w‖₁)",
               f"{objective(sk.coef_, sk.intercept_):.6f} / {objective(ours, ours_b):.6f}")
    rep.figure("intercept sklearn / cruise", f"{sk.intercept_:.4f} / {ours_b:.4f}")
    rep.figure("‖w − w_sk‖ / ‖w_sk‖", f"{np.linalg.norm(ours - sk.coef_) / np.linalg.norm(sk.coef_):.2e}")
    rep.figure("cruise job wall / training secs", f"{secs:.2f} / {s['train_secs']:.2f}")
    rep.figure("sklearn Lasso fit secs", f"{sk_secs:.2f}")
    rep.check("lasso same support as sklearn", support_ours == support_sk,
              f"only cruise {sorted(support_ours - support_sk)}, only sklearn {sorted(support_sk - support_ours)}")
    rep.check("lasso coefficients within 5% of sklearn", bool(rel.max() <= 0.05),
              f"largest relative error {rel.max():.2e} (coefficient {on[int(rel.argmax())] + 1})")


def check_nmf(c, rep):
    data = c.path("nmf.txt")
    truth = c.datagen("nmf", data, truth=c.path("nmf.truth.json"), rows=1000, columns=400,
                      rank=5, density=0.3, noise=0.1, seed=1)
    model_path = c.path("nmf.model")
    s, secs = c.run("nmf", data, epochs=30, mini_batch=20, model_out=model_path, settings={
        "nmf.columns": 400, "nmf.rank": 5, "nmf.step_size": 0.05, "nmf.decay": 0.05,
        "nmf.l2": 0.001, "store.input_blocks": 4,
    })
    rmse_by_epoch = [math.sqrt(mean_loss(e["stats"])) for e in s["epochs"]]
    rmse = math.sqrt(mean_loss(s["final_stats"]))
    noise = truth["noise_rms"]
    _, values = read_model(model_path)
    min_r = min(v.min() for v in values.values())
    rep.figure("observed entries", f"{truth['entries']} ({s['records']} rows)")
    rep.figure("training RMSE by epoch (1, 5, 10, 20, last)",
               " ".join(f"{rmse_by_epoch[i]:.4f}" for i in (0, 4, 9, 19, -1)))
    rep.figure("cruise job wall / training secs", f"{secs:.2f} / {s['train_secs']:.2f}")
    rep.check("nmf training RMSE within 10% of the noise", abs(rmse - noise) <= 0.1 * noise,
              f"RMSE {rmse:.4f} vs noise {noise:.4f} ({100 * (rmse / noise - 1):+.1f}%)")
    rep.check("nmf column factors non-negative", min_r >= 0.0,
              f"smallest value {min_r:.3g} over {len(values)} columns")


def check_lda(c, rep):
    from scipy.optimize import linear_sum_assignment
    from sklearn.decomposition import LatentDirichletAllocation

    vocab, k, alpha, beta = 500, 10, 0.1, 0.05
    data = c.path("lda.txt")
    truth = c.datagen("lda", data, truth=c.path("lda.truth.json"), docs=2000, vocab=vocab,
                      topics=k, doc_len=100, alpha=alpha, beta=beta, seed=2)
    model_path = c.path("lda.model")
    s, secs = c.run("lda", data, epochs=50, mini_batch=50, model_out=model_path, settings={
        "lda.vocab": vocab, "lda.topics": k, "lda.alpha": alpha, "lda.beta": beta,
        "store.input_blocks": 4,
    })
    nll = [mean_loss(e["stats"]) for e in s["epochs"]]
    burn_in = 10
    final_nll = mean_loss(s["final_stats"])

    _, values = read_model(model_path)
    nwk = np.zeros((vocab, k))
    for w, v in values.items():
        if w < vocab:
            nwk[w] = v
    nk = values.get(vocab, np.zeros(k))
    phi = ((nwk + beta) / (nk + vocab * beta)).T  # topics × words
    true_topics = np.array(truth["topics"])

    def cosines(a, b):
        a = a / np.linalg.norm(a, axis=1, keepdims=True)
        b = b / np.linalg.norm(b, axis=1, keepdims=True)
        return a @ b.T

    C = cosines(true_topics, phi)
    best = C.max(axis=1)
    r, col = linear_sum_assignment(-C)

    X = read_bag_of_words(data, vocab)
    t0 = time.monotonic()
    sk = LatentDirichletAllocation(n_components=k, doc_topic_prior=alpha,
                                   topic_word_prior=beta, learning_method="batch",
                                   max_iter=20, random_state=0).fit(X)
    sk_secs = time.monotonic() - t0
    sk_bound = sk.perplexity(X)
    theta = sk.transform(X)
    sk_phi = sk.components_ / sk.components_.sum(axis=1, keepdims=True)
    sk_plugin = math.exp(-X.multiply(np.log(theta @ sk_phi)).sum() / X.sum())
    sk_best = cosines(true_topics, sk_phi).max(axis=1).mean()

    rep.figure("documents / tokens", f"{X.shape[0]} / {int(X.sum())}")
    rep.figure("NLL/token by epoch (1, 5, 10, 20, last)",
               " ".join(f"{nll[i]:.4f}" for i in (0, 4, 9, 19, -1)))
    rep.figure("perplexity cruise (plug-in θ·φ, final)", f"{math.exp(final_nll):.2f}")
    rep.figure("perplexity sklearn plug-in θ·φ / bound", f"{sk_plugin:.2f} / {sk_bound:.2f}")
    rep.figure("topic match cruise one-to-one mean cos", f"{C[r, col].mean():.4f}")
    rep.figure("topic match sklearn mean best-match cos", f"{sk_best:.4f}")
    rep.figure("cruise job wall / training secs", f"{secs:.2f} / {s['train_secs']:.2f}")
    rep.figure("sklearn LDA fit secs (batch VB, 20 iterations)", f"{sk_secs:.2f}")
    rep.check("lda counts consistent", bool(np.allclose(nwk.sum(axis=0), nk)) and
              int(nk.sum()) == int(truth["tokens"]),
              f"Σ n_k = {int(nk.sum())}, tokens {truth['tokens']}")
    rises = nll[-1] < nll[burn_in - 1] and final_nll <= nll[burn_in - 1]
    rep.check("lda log-likelihood rises after burn-in", rises,
              f"NLL/token at epoch {burn_in} {nll[burn_in - 1]:.4f} -> last {nll[-1]:.4f}, final {final_nll:.4f}")
    rep.check("lda topics match (mean best cosine >= 0.9)", best.mean() >= 0.9,
              f"mean {best.mean():.4f}, worst {best.min():.4f}")


CHECKS = {"mlr": check_mlr, "lasso": check_lasso, "nmf": check_nmf, "lda": check_lda}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cruise", required=True, help="the cruise binary")
    ap.add_argument("--work", required=True, help="scratch directory")
    ap.add_argument("apps", nargs="*", help=f"checks to run: {' '.join(CHECKS)} (default: all)")
    a = ap.parse_args()
    unknown = [x for x in a.apps if x not in CHECKS]
    if unknown:
        ap.error(f"unknown check(s) {unknown}; choose from {list(CHECKS)}")
    a.apps = a.apps or list(CHECKS)
    c = Cruise(a.cruise, a.work)
    rep = Report()
    t_all = time.monotonic()
    for app in a.apps:
        print(f"== {app}", flush=True)
        t0 = time.monotonic()
        try:
            CHECKS[app](c, rep)
        except Exception as e:  # a failed job or script error fails the check
            rep.check(f"{app} ran", False, f"{type(e).__name__}: {e}")
        print(f"  ({time.monotonic() - t0:.1f} s)", flush=True)
    print(f"== {len(rep.failed)} failed check(s) in {time.monotonic() - t_all:.1f} s"
          + (": " + ", ".join(rep.failed) if rep.failed else ""))
    sys.exit(1 if rep.failed else 0)


if __name__ == "__main__":
    main()
