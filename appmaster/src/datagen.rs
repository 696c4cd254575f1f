//! Input preparation: use the configured input, or generate a data set for
//! the app into the work directory (cached by its parameters, so repeated runs
//! reuse it).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use cruise_conf::{AppKind, CruiseConfig};
use cruise_container::apps::mlr;

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

/// The job's input: `job.input` if set, else a generated data set.
pub fn prepare_input(config: &CruiseConfig, work_dir: &Path) -> Result<String, AmError> {
    if !config.job.input.is_empty() {
        return Ok(config.job.input.clone());
    }
    match config.job.app {
        AppKind::Mlr => {
            let m = &config.mlr;
            let p = mlr::GenParams {
                samples: m.generate_samples,
                features: m.features,
                classes: m.classes,
                nnz: m.generate_nnz,
                seed: config.job.seed,
            };
            let name = format!(
                "mlr-n{}-f{}-c{}-z{}-s{}.libsvm",
                p.samples, p.features, p.classes, p.nnz, p.seed
            );
            let path = work_dir.join("data").join(name);
            if !path.exists() {
                write_atomically(&path, |w| mlr::generate(&p, w).map(|_| ()))?;
            }
            Ok(path.display().to_string())
        }
    }
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
