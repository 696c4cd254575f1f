//! Input preparation: use the configured input, or generate a data set for
//! the app into the work directory (cached by its parameters, so repeated runs
//! reuse it). Also the generators behind `cruise datagen`, with their ground
//! truth as JSON.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use cruise_conf::{AppKind, CruiseConfig};
use cruise_container::apps::{lasso, lda, mlr, nmf};

use crate::am::AmError;

/// The work directory: `job.work_dir`, or `cruise` in the system's temporary
/// directory.
pub fn work_dir(config: &CruiseConfig) -> PathBuf {
    if config.job.work_dir.is_empty() {
        std::env::temp_dir().join("cruise")
    } else {
        PathBuf::from(&config.job.work_dir)
    }
}

/// A data set to generate: one app's generator and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum GenSpec {
    /// Multinomial logistic regression (libsvm).
    Mlr(mlr::GenParams),
    /// A low-rank non-negative matrix plus noise (NMF row format).
    Nmf(nmf::GenParams),
    /// A corpus drawn from known topics (bag of words).
    Lda(lda::GenParams),
    /// Sparse coefficients plus noise (libsvm regression).
    Lasso(lasso::GenParams),
}

impl GenSpec {
    /// The data set a job generates when `job.input` is empty.
    pub fn from_config(config: &CruiseConfig) -> GenSpec {
        let seed = config.job.seed;
        match config.job.app {
            AppKind::Mlr => {
                let m = &config.mlr;
                GenSpec::Mlr(mlr::GenParams {
                    samples: m.generate_samples,
                    features: m.features,
                    classes: m.classes,
                    nnz: m.generate_nnz,
                    seed,
                })
            }
            AppKind::Nmf => {
                let n = &config.nmf;
                GenSpec::Nmf(nmf::GenParams {
                    rows: n.generate_rows,
                    columns: n.columns,
                    rank: n.rank,
                    density: n.generate_density,
                    noise: n.generate_noise,
                    seed,
                })
            }
            AppKind::Lda => {
                let l = &config.lda;
                GenSpec::Lda(lda::GenParams {
                    docs: l.generate_docs,
                    vocab: l.vocab,
                    topics: l.topics,
                    doc_len: l.generate_doc_len,
                    alpha: l.alpha,
                    beta: l.beta,
                    seed,
                })
            }
            AppKind::Lasso => {
                let a = &config.lasso;
                GenSpec::Lasso(lasso::GenParams {
                    samples: a.generate_samples,
                    features: a.features,
                    support: a.generate_support,
                    noise: a.generate_noise,
                    seed,
                })
            }
        }
    }

    /// A file name that identifies the data set (used to cache it).
    pub fn file_name(&self) -> String {
        match self {
            GenSpec::Mlr(p) => format!(
                "mlr-n{}-f{}-c{}-z{}-s{}.libsvm",
                p.samples, p.features, p.classes, p.nnz, p.seed
            ),
            GenSpec::Nmf(p) => format!(
                "nmf-r{}-c{}-k{}-d{}-e{}-s{}.txt",
                p.rows, p.columns, p.rank, p.density, p.noise, p.seed
            ),
            GenSpec::Lda(p) => format!(
                "lda-d{}-v{}-k{}-l{}-a{}-b{}-s{}.txt",
                p.docs, p.vocab, p.topics, p.doc_len, p.alpha, p.beta, p.seed
            ),
            GenSpec::Lasso(p) => format!(
                "lasso-n{}-f{}-k{}-e{}-s{}.libsvm",
                p.samples, p.features, p.support, p.noise, p.seed
            ),
        }
    }

    /// Checks parameters that would make the generator produce nothing useful.
    pub fn check(&self) -> Result<(), String> {
        let ok = match self {
            GenSpec::Mlr(p) => p.features >= 1 && p.classes >= 2 && p.nnz >= 1,
            GenSpec::Nmf(p) => {
                p.columns >= 1
                    && p.rank >= 1
                    && p.density > 0.0
                    && p.density <= 1.0
                    && p.noise >= 0.0
                    && p.rows < u64::from(nmf::MAX_ROW_ID)
            }
            GenSpec::Lda(p) => {
                p.vocab >= 1
                    && p.topics >= 1
                    && p.doc_len >= 1
                    && p.alpha > 0.0
                    && p.beta > 0.0
                    && p.docs < u64::from(lda::MAX_DOC_ID)
            }
            GenSpec::Lasso(p) => p.features >= 1 && p.support <= p.features && p.noise >= 0.0,
        };
        if ok {
            Ok(())
        } else {
            Err(format!("unusable generator parameters: {self:?}"))
        }
    }

    /// Writes the data set; returns the bytes written and the ground truth
    /// as JSON.
    pub fn write(&self, w: &mut impl Write) -> std::io::Result<(u64, Value)> {
        Ok(match self {
            GenSpec::Mlr(p) => {
                let bytes = mlr::generate(p, w)?;
                (
                    bytes,
                    json!({ "app": "mlr", "samples": p.samples, "classes": p.classes }),
                )
            }
            GenSpec::Nmf(p) => {
                let (bytes, t) = nmf::generate(p, w)?;
                (
                    bytes,
                    json!({
                        "app": "nmf",
                        "rows": p.rows,
                        "columns": p.columns,
                        "rank": p.rank,
                        "noise_std": p.noise,
                        "noise_rms": t.noise_rms,
                        "entries": t.entries,
                    }),
                )
            }
            GenSpec::Lda(p) => {
                let (bytes, t) = lda::generate(p, w)?;
                (
                    bytes,
                    json!({
                        "app": "lda",
                        "docs": p.docs,
                        "vocab": p.vocab,
                        "alpha": p.alpha,
                        "beta": p.beta,
                        "tokens": t.tokens,
                        "topics": t.topics,
                    }),
                )
            }
            GenSpec::Lasso(p) => {
                let (bytes, t) = lasso::generate(p, w)?;
                (
                    bytes,
                    json!({
                        "app": "lasso",
                        "samples": p.samples,
                        "noise_std": p.noise,
                        "intercept": t.intercept,
                        "coef": t.coef,
                    }),
                )
            }
        })
    }
}

/// The job's input: `job.input` if set, else a generated data set.
pub fn prepare_input(config: &CruiseConfig, work_dir: &Path) -> Result<String, AmError> {
    if !config.job.input.is_empty() {
        return Ok(config.job.input.clone());
    }
    let spec = GenSpec::from_config(config);
    spec.check().map_err(AmError::Config)?;
    let path = work_dir.join("data").join(spec.file_name());
    if !path.exists() {
        write_atomically(&path, |w| spec.write(w).map(|_| ()))?;
    }
    Ok(path.display().to_string())
}

/// Writes a file through a temporary name and renames it into place, so a
/// reader never sees half a data set.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<(), AmError> {
    let io = |what: &str, source| AmError::Io {
        context: format!("{what} {}", path.display()),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io("creating the directory of", e))?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let file = std::fs::File::create(&tmp).map_err(|e| io("creating", e))?;
    let mut w = BufWriter::new(file);
    write(&mut w)
        .and_then(|()| w.flush())
        .map_err(|e| io("writing", e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("renaming into place", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every app's generated data set parses with the app built from the
    /// same configuration (the generator and the parser agree on the format).
    #[test]
    fn generated_inputs_parse_with_their_app() {
        let dir = tempfile::tempdir().unwrap();
        for app in [AppKind::Mlr, AppKind::Nmf, AppKind::Lda, AppKind::Lasso] {
            let mut config = CruiseConfig::default();
            config.job.app = app;
            config.mlr.generate_samples = 200;
            config.nmf.generate_rows = 50;
            config.lda.generate_docs = 50;
            config.lasso.generate_samples = 50;
            let path = prepare_input(&config, dir.path()).unwrap();
            assert!(path.contains(app.as_str()), "{path}");
            let text = std::fs::read(&path).unwrap();
            let params = cruise_container::apps::params(&config).unwrap();
            let a = cruise_container::apps::build(&config, &params).unwrap();
            let input = a.parse(&text).unwrap();
            assert_eq!(
                input.len(),
                50.max(if app == AppKind::Mlr { 200 } else { 0 })
            );
            // Cached: a second call reuses the file.
            let again = prepare_input(&config, dir.path()).unwrap();
            assert_eq!(again, path);
        }
    }

    #[test]
    fn truth_is_json_with_the_generators_figures() {
        let spec = GenSpec::Lasso(lasso::GenParams {
            samples: 10,
            features: 5,
            support: 2,
            noise: 0.1,
            seed: 1,
        });
        let mut out = Vec::new();
        let (bytes, truth) = spec.write(&mut out).unwrap();
        assert_eq!(bytes, out.len() as u64);
        let coef = truth["coef"].as_array().unwrap();
        assert_eq!(coef.len(), 5);
        assert_eq!(coef.iter().filter(|c| c.as_f64() != Some(0.0)).count(), 2);
        assert!(
            GenSpec::Lasso(lasso::GenParams {
                samples: 10,
                features: 5,
                support: 6,
                noise: 0.1,
                seed: 1,
            })
            .check()
            .is_err()
        );
    }
}
