//! `cruise datagen`: its arguments, one subcommand per app, and the command
//! (a generated data set with its ground truth, or NMF triplets converted
//! to rows); the generators themselves are the apps' (`crate::datagen`).

use std::io::Write as _;
use std::path::PathBuf;

use clap::{Args, Subcommand};

use cruise_conf::{LassoConfig, LdaConfig, NmfConfig};

use crate::datagen;

/// `cruise datagen`.
#[derive(Args, Debug)]
pub struct DatagenArgs {
    /// The app whose data to generate.
    #[command(subcommand)]
    pub app: DatagenApp,
}

/// Data sets `cruise datagen` makes, one per app.
#[derive(Subcommand, Debug)]
pub enum DatagenApp {
    /// libsvm records labelled by a random linear model (`label idx:val ...`).
    Mlr(MlrGenArgs),
    /// A low-rank non-negative matrix plus Gaussian noise (`row: col,val ...`),
    /// or a conversion of `row col value` triplets to that format.
    Nmf(NmfGenArgs),
    /// A corpus drawn from known topics (`doc_id word:count ...`).
    Lda(LdaGenArgs),
    /// Regression data with sparse true coefficients plus noise (libsvm
    /// `target idx:val ...`).
    Lasso(LassoGenArgs),
}

/// Options every generator has.
#[derive(Args, Debug, Clone)]
pub struct GenOut {
    /// Seed (the same seed gives the same file).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Output file.
    #[arg(short, long, value_name = "PATH")]
    pub out: PathBuf,
    /// Also write the ground truth here, as JSON (true coefficients, topics,
    /// noise level).
    #[arg(long, value_name = "PATH")]
    pub truth: Option<PathBuf>,
}

/// `cruise datagen mlr`.
#[derive(Args, Debug)]
pub struct MlrGenArgs {
    /// Records.
    #[arg(long, default_value_t = 20_000)]
    pub samples: u64,
    /// Features (libsvm indices 1..=F).
    #[arg(long, default_value_t = 1_000)]
    pub features: u32,
    /// Classes (labels 0..K-1).
    #[arg(long, default_value_t = 10)]
    pub classes: u32,
    /// Non-zero features per record.
    #[arg(long, default_value_t = 40)]
    pub nnz: u32,
    /// Output.
    #[command(flatten)]
    pub gen_out: GenOut,
}

/// `cruise datagen nmf`.
#[derive(Args, Debug)]
pub struct NmfGenArgs {
    /// Rows.
    #[arg(long, default_value_t = NmfConfig::default().generate_rows)]
    pub rows: u64,
    /// Columns.
    #[arg(long, default_value_t = NmfConfig::default().columns)]
    pub columns: u32,
    /// Rank of the true factors.
    #[arg(long, default_value_t = NmfConfig::default().rank)]
    pub rank: u32,
    /// Fraction of entries observed.
    #[arg(long, default_value_t = NmfConfig::default().generate_density)]
    pub density: f64,
    /// Standard deviation of the noise.
    #[arg(long, default_value_t = NmfConfig::default().generate_noise)]
    pub noise: f64,
    /// Instead of generating, convert this file of `row col value` triplets
    /// (one entry per line) to the row format.
    #[arg(long, value_name = "PATH")]
    pub from_triplets: Option<PathBuf>,
    /// Output.
    #[command(flatten)]
    pub gen_out: GenOut,
}

/// `cruise datagen lda`.
#[derive(Args, Debug)]
pub struct LdaGenArgs {
    /// Documents.
    #[arg(long, default_value_t = LdaConfig::default().generate_docs)]
    pub docs: u64,
    /// Vocabulary size (word ids 0..V-1).
    #[arg(long, default_value_t = LdaConfig::default().vocab)]
    pub vocab: u32,
    /// Topics.
    #[arg(long, default_value_t = LdaConfig::default().topics)]
    pub topics: u32,
    /// Mean tokens per document.
    #[arg(long, default_value_t = LdaConfig::default().generate_doc_len)]
    pub doc_len: u32,
    /// Dirichlet prior of the document-topic mixtures.
    #[arg(long, default_value_t = LdaConfig::default().alpha)]
    pub alpha: f64,
    /// Dirichlet prior of the topics' word distributions.
    #[arg(long, default_value_t = LdaConfig::default().beta)]
    pub beta: f64,
    /// Output.
    #[command(flatten)]
    pub gen_out: GenOut,
}

/// `cruise datagen lasso`.
#[derive(Args, Debug)]
pub struct LassoGenArgs {
    /// Records.
    #[arg(long, default_value_t = LassoConfig::default().generate_samples)]
    pub samples: u64,
    /// Features (libsvm indices 1..=F; every record has all of them).
    #[arg(long, default_value_t = LassoConfig::default().features)]
    pub features: u32,
    /// Non-zero true coefficients.
    #[arg(long, default_value_t = LassoConfig::default().generate_support)]
    pub support: u32,
    /// Standard deviation of the noise on the targets.
    #[arg(long, default_value_t = LassoConfig::default().generate_noise)]
    pub noise: f64,
    /// Output.
    #[command(flatten)]
    pub gen_out: GenOut,
}

/// Runs `cruise datagen`: returns the bytes written and the output file.
pub fn datagen(args: DatagenArgs) -> anyhow::Result<(u64, PathBuf)> {
    use cruise_container::apps::{lasso, lda, mlr, nmf};
    let (spec, out) = match args.app {
        DatagenApp::Mlr(a) => (
            datagen::GenSpec::Mlr(mlr::GenParams {
                samples: a.samples,
                features: a.features,
                classes: a.classes,
                nnz: a.nnz,
                seed: a.gen_out.seed,
            }),
            a.gen_out,
        ),
        DatagenApp::Nmf(a) => {
            if let Some(src) = &a.from_triplets {
                return convert_triplets(src, &a.gen_out.out);
            }
            (
                datagen::GenSpec::Nmf(nmf::GenParams {
                    rows: a.rows,
                    columns: a.columns,
                    rank: a.rank,
                    density: a.density,
                    noise: a.noise,
                    seed: a.gen_out.seed,
                }),
                a.gen_out,
            )
        }
        DatagenApp::Lda(a) => (
            datagen::GenSpec::Lda(lda::GenParams {
                docs: a.docs,
                vocab: a.vocab,
                topics: a.topics,
                doc_len: a.doc_len,
                alpha: a.alpha,
                beta: a.beta,
                seed: a.gen_out.seed,
            }),
            a.gen_out,
        ),
        DatagenApp::Lasso(a) => (
            datagen::GenSpec::Lasso(lasso::GenParams {
                samples: a.samples,
                features: a.features,
                support: a.support,
                noise: a.noise,
                seed: a.gen_out.seed,
            }),
            a.gen_out,
        ),
    };
    spec.check().map_err(anyhow::Error::msg)?;
    let mut bytes = 0;
    let mut truth = serde_json::Value::Null;
    datagen::write_atomically(&out.out, |w| {
        (bytes, truth) = spec.write(w)?;
        Ok(())
    })?;
    if let Some(path) = &out.truth {
        let text = serde_json::to_string(&truth)?;
        datagen::write_atomically(path, |w| w.write_all(text.as_bytes()))?;
    }
    Ok((bytes, out.out))
}

/// `cruise datagen nmf --from-triplets`: triplets to the row format.
fn convert_triplets(
    src: &std::path::Path,
    out: &std::path::Path,
) -> anyhow::Result<(u64, PathBuf)> {
    let text =
        std::fs::read(src).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", src.display()))?;
    let rows = cruise_container::apps::nmf::triplets_to_rows(&text).map_err(|e| {
        let line = 1 + text[..e.offset.min(text.len())]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        anyhow::anyhow!("{}:{line}: {}", src.display(), e.message)
    })?;
    datagen::write_atomically(out, |w| w.write_all(rows.as_bytes()))?;
    Ok((rows.len() as u64, out.to_path_buf()))
}
