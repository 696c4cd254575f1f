"""Helpers shared by the quality checks and the throughput benchmark: run the
`cruise` binary (datagen and real jobs on the local runtime), read its JSON
summary and the model files it writes, and read the apps' input formats."""

import json
import math
import os
import resource
import subprocess
import sys
import time

import numpy as np
from scipy.sparse import csr_matrix


class Cruise:
    """The `cruise` binary plus a scratch directory for one run of the checks."""

    def __init__(self, binary, work):
        self.binary = binary
        self.work = work
        # CPU seconds (user + system) of the last command and the processes
        # it started and waited for (a job's AM and evaluators).
        self.last_cpu_secs = 0.0
        os.makedirs(work, exist_ok=True)

    def path(self, name):
        return os.path.join(self.work, name)

    def _run(self, args, what):
        t0 = time.monotonic()
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(
            [self.binary] + args, capture_output=True, text=True, check=False
        )
        secs = time.monotonic() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.last_cpu_secs = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        if p.returncode != 0:
            sys.stderr.write(p.stderr)
            raise RuntimeError(f"{what} failed with status {p.returncode}: {p.stderr.strip()[-500:]}")
        return p, secs

    def datagen(self, app, out, truth=None, **params):
        """`cruise datagen APP --key value ... -o OUT [--truth TRUTH]`; returns the truth."""
        args = ["datagen", app]
        for k, v in params.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        args += ["-o", out]
        if truth:
            args += ["--truth", truth]
        self._run(args, f"cruise datagen {app}")
        if truth:
            with open(truth) as f:
                return json.load(f)
        return None

    def run(self, app, input_path, epochs, mini_batch, settings, containers=2,
            workers=1, eval_input=None, model_out=None):
        """`cruise run` with `--json`; returns (summary, wall seconds)."""
        args = [
            "run", "-q", "--json", "--app", app, "-i", input_path,
            "-n", str(containers), "-w", str(workers), "-e", str(epochs),
            "-b", str(mini_batch), "--work-dir", self.path("cruise-work"),
        ]
        if eval_input:
            args += ["--eval-input", eval_input]
        if model_out:
            args += ["--model-out", model_out]
        for k, v in settings.items():
            args += ["--set", f"{k}={v}"]
        p, secs = self._run(args, f"cruise run --app {app}")
        return json.loads(p.stdout), secs


def mean_loss(stats):
    """Mean loss per term, as `Stats::mean_loss` computes it."""
    terms = stats["loss_terms"] or stats["records"]
    return stats["loss_sum"] / terms if terms else math.nan


def accuracy(stats):
    return stats["correct"] / stats["records"] if stats["records"] else math.nan


def read_model(path):
    """A model file written by `--model-out`: (header dict, {key: np.array})."""
    header, values = {}, {}
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                if "=" in line:
                    k, v = line[1:].split("=", 1)
                    header[k.strip()] = v.strip()
                continue
            parts = line.split()
            if parts:
                values[int(parts[0])] = np.array([float(x) for x in parts[1:]])
    return header, values


def int32_indices(x):
    """A CSR matrix with 32-bit indices (some scikit-learn estimators accept
    nothing else, and readers may produce 64-bit ones)."""
    x.indices = x.indices.astype(np.int32)
    x.indptr = x.indptr.astype(np.int32)
    return x


def read_libsvm(path, n_features):
    """A 1-based libsvm file as (CSR matrix with column j-1 for index j, targets)."""
    from sklearn.datasets import load_svmlight_file

    x, y = load_svmlight_file(path, n_features=n_features, zero_based=False)
    return int32_indices(x), y


def read_bag_of_words(path, vocab):
    """An LDA input file (`doc word:count ...`) as a sparse doc × word matrix."""
    rows, cols, vals = [], [], []
    n = 0
    with open(path) as f:
        for line in f:
            toks = line.split()
            if not toks:
                continue
            for tok in toks[1:]:
                w, c = tok.split(":")
                rows.append(n)
                cols.append(int(w))
                vals.append(int(c))
            n += 1
    x = csr_matrix((np.array(vals, dtype=np.float64),
                    (np.array(rows, dtype=np.int32), np.array(cols, dtype=np.int32))),
                   shape=(n, vocab))
    return int32_indices(x)


def read_nmf_rows(path):
    """An NMF input file (`row: col,val ...`) as (rows, cols, values) arrays."""
    r, c, v = [], [], []
    with open(path) as f:
        for line in f:
            toks = line.split()
            if not toks:
                continue
            row = int(toks[0].rstrip(":"))
            for tok in toks[1:]:
                col, val = tok.split(",")
                r.append(row)
                c.append(int(col))
                v.append(float(val))
    return np.array(r), np.array(c), np.array(v)


class Report:
    """Collects named pass/fail checks and prints them as they come."""

    def __init__(self):
        self.failed = []

    def figure(self, name, text):
        print(f"  {name:<44} {text}", flush=True)

    def check(self, name, ok, text):
        mark = "ok  " if ok else "FAIL"
        print(f"  [{mark}] {name:<38} {text}", flush=True)
        if not ok:
            self.failed.append(name)
        return ok
