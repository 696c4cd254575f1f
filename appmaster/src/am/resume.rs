//! Resuming a job whose AM died (`cruise run --resume WORK_DIR`).
//!
//! At its start a job writes its configuration to
//! `<work dir>/jobs/config/<job id>.toml` ([`persist_config`]): the
//! effective configuration, with the input it reads (a generated data set's
//! path) and the checkpoint directory it writes to. [`prepare`] reads the
//! newest such file of a work directory back, and finds the job's newest
//! usable checkpoint (`cruise_container::checkpoint::latest`: a torn or
//! corrupt newest one falls back to the one before) and its epochs so far
//! (from its history files). The job then runs again under the same job id:
//! its servers load the model blocks from the checkpoint instead of
//! creating them, and the job counts on from the checkpoint's epoch and
//! records, so that only the remaining epochs are trained. Its new
//! attempt's history is `history/<job id>.resume-<n>.jsonl`, which starts
//! with the epochs carried over.
//!
//! A job whose history says it finished is not run again
//! ([`Prepared::Finished`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cruise_conf::CruiseConfig;
use cruise_container::checkpoint::{self, CheckpointError, Manifest};
use cruise_container::protocol::{MODEL_TABLE, Stats};

use super::history::{self, HISTORY_DIR, Record};
use super::{AmError, EpochSummary};

/// The directory, under a job's work directory (`<work dir>/jobs`), of the
/// configurations jobs were started with.
pub const CONFIG_DIR: &str = "config";

/// Errors of preparing a resume; each names the directory or file.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// No job configuration in the work directory.
    #[error(
        "{dir} holds no job to resume: no job configuration (*.toml) in {config_dir} \
         (a job writes it there when it starts; is {dir} the --work-dir of a job?)"
    )]
    NoJob {
        /// The work directory.
        dir: String,
        /// Where configurations were looked for.
        config_dir: String,
    },
    /// A file could not be read.
    #[error("{path}: {message}")]
    Unreadable {
        /// The file or directory.
        path: String,
        /// Why.
        message: String,
    },
    /// The job has no usable checkpoint.
    #[error(
        "job {job_id} in {work_dir} cannot be resumed: {source} \
         (looked for checkpoint folders ckpt-<n> with a MANIFEST.json in {dir}; \
         checkpoint.every_epochs = {every_epochs}, checkpoint.every_secs = {every_secs})"
    )]
    NoCheckpoint {
        /// The job.
        job_id: String,
        /// The work directory.
        work_dir: String,
        /// The checkpoint directory.
        dir: String,
        /// `checkpoint.every_epochs`.
        every_epochs: u32,
        /// `checkpoint.every_secs`.
        every_secs: u64,
        /// What was found.
        #[source]
        source: Box<CheckpointError>,
    },
    /// Checkpoints were off for the job.
    #[error(
        "job {job_id} in {work_dir} cannot be resumed: it took no checkpoints \
         (checkpoint.enabled = false, or no checkpoint.dir, in {config})"
    )]
    CheckpointsOff {
        /// The job.
        job_id: String,
        /// The work directory.
        work_dir: String,
        /// Its configuration file.
        config: String,
    },
    /// An earlier attempt of a YARN application ended the job itself (it
    /// failed or was cancelled): a later attempt does not run it again, as
    /// YARN starts none after an AM that unregistered.
    #[error("job {job_id} ended {outcome} in an earlier attempt ({history}): {error}")]
    Ended {
        /// The job.
        job_id: String,
        /// `failed` or `cancelled`.
        outcome: String,
        /// Why, as recorded.
        error: String,
        /// The history that says so.
        history: String,
    },
    /// The checkpoint does not fit the job's configuration.
    #[error("job {job_id}: checkpoint {folder} does not fit its configuration: {message}")]
    Mismatch {
        /// The job.
        job_id: String,
        /// The checkpoint.
        folder: String,
        /// What does not fit.
        message: String,
    },
}

/// What a resumed job starts from.
#[derive(Debug, Clone)]
pub struct Resume {
    /// The job's id (the resumed job keeps it).
    pub job_id: String,
    /// The checkpoint its model blocks are loaded from.
    pub manifest: Manifest,
    /// The checkpoint's folder.
    pub folder: String,
    /// The number of the resumed job's first checkpoint: after every
    /// folder in the checkpoint directory, torn ones included.
    pub next_checkpoint: u64,
    /// The epochs done up to the checkpoint, from the history (an epoch
    /// the history lacks has no figures).
    pub epochs: Vec<EpochSummary>,
    /// The new attempt's history file.
    pub history_file: PathBuf,
}

/// What `cruise run --resume` found in a work directory.
#[derive(Debug)]
pub enum Prepared {
    /// A job to resume: its configuration (the input it read in
    /// `job.input`) and where it resumes from.
    Resume {
        /// The configuration it was started with.
        config: Box<CruiseConfig>,
        /// Where it resumes from.
        resume: Box<Resume>,
    },
    /// The job had finished; nothing to do.
    Finished {
        /// The job.
        job_id: String,
        /// The history that says so.
        history: PathBuf,
    },
}

/// The configuration file of job `job_id` under its work directory
/// `jobs_dir` (`<work dir>/jobs`).
pub fn config_path(jobs_dir: &Path, job_id: &str) -> PathBuf {
    jobs_dir.join(CONFIG_DIR).join(format!("{job_id}.toml"))
}

/// Writes the configuration job `job_id` runs with, reading `input`, to
/// [`config_path`] (through a temporary name, renamed into place).
pub fn persist_config(
    jobs_dir: &Path,
    job_id: &str,
    config: &CruiseConfig,
    input: &str,
) -> Result<PathBuf, AmError> {
    let mut c = config.clone();
    c.job.input = input.to_string();
    let path = config_path(jobs_dir, job_id);
    let text = toml::to_string_pretty(&c).map_err(|e| AmError::Io {
        context: format!("writing the job's configuration {}", path.display()),
        source: std::io::Error::other(e),
    })?;
    crate::datagen::write_atomically(&path, |w| std::io::Write::write_all(w, text.as_bytes()))?;
    Ok(path)
}

/// The newest job configuration in `jobs_dir/config` and its job id.
fn newest_config(work_dir: &Path, jobs_dir: &Path) -> Result<(PathBuf, String), ResumeError> {
    let dir = jobs_dir.join(CONFIG_DIR);
    let no_job = || ResumeError::NoJob {
        dir: work_dir.display().to_string(),
        config_dir: dir.display().to_string(),
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Err(no_job());
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "toml"))
        .filter_map(|e| {
            let modified = e.metadata().ok()?.modified().ok()?;
            let id = e.path().file_stem()?.to_str()?.to_string();
            Some((modified, e.path(), id))
        })
        .max()
        .map(|(_, p, id)| (p, id))
        .ok_or_else(no_job)
}

/// Finds what to resume in `work_dir` (a job's `--work-dir`): its newest
/// job, that job's newest usable checkpoint and its epochs up to it.
pub async fn prepare(work_dir: &Path) -> Result<Prepared, ResumeError> {
    let jobs_dir = work_dir.join("jobs");
    let (config_file, job_id) = newest_config(work_dir, &jobs_dir)?;
    let mut config = load_config(&config_file)?;
    config.job.work_dir = work_dir.display().to_string();
    prepare_job(work_dir, &config_file, config, job_id).await
}

/// Finds what a later attempt of a YARN application resumes: job
/// `job_id` (every attempt of an application runs the same job) run with
/// `config`, read from `config_file` (the application's `job.toml`, which
/// every attempt is given, so the attempts' configurations agree), whose
/// history is in `work_dir` when an earlier attempt ran on this node (the
/// attempts of an application share its local directory there). Errors as
/// [`prepare`]'s: [`ResumeError::NoCheckpoint`] and
/// [`ResumeError::CheckpointsOff`] say there is nothing to resume from;
/// and [`ResumeError::Ended`] when an earlier attempt's history ends with
/// the job failed or cancelled (an AM that ends its job unregisters, so
/// YARN would start no later attempt; the simulator, which has no
/// unregistering, does).
pub async fn prepare_attempt(
    work_dir: &Path,
    config_file: &Path,
    job_id: &str,
    mut config: CruiseConfig,
) -> Result<Prepared, ResumeError> {
    let history_dir = work_dir.join("jobs").join(HISTORY_DIR);
    for f in history::files(&history_dir, job_id) {
        let records = history::read(&f).map_err(|e| ResumeError::Unreadable {
            path: f.display().to_string(),
            message: e.to_string(),
        })?;
        for r in records {
            if let Record::End { outcome, error, .. } = r
                && outcome != "finished"
            {
                return Err(ResumeError::Ended {
                    job_id: job_id.to_string(),
                    outcome,
                    error: error.unwrap_or_default(),
                    history: f.display().to_string(),
                });
            }
        }
    }
    // As the first attempt's job did: without a directory every evaluator
    // reaches, it took no checkpoints.
    if config.checkpoint.dir.is_empty() {
        config.checkpoint.enabled = false;
    }
    prepare_job(work_dir, config_file, config, job_id.to_string()).await
}

fn load_config(config_file: &Path) -> Result<CruiseConfig, ResumeError> {
    cruise_conf::load_file(config_file).map_err(|e| ResumeError::Unreadable {
        path: config_file.display().to_string(),
        message: e.to_string(),
    })
}

/// What job `job_id` (of `work_dir`, run with `config`, which
/// `config_file` holds) resumes from: nothing if its history says it
/// finished, else its newest usable checkpoint and its epochs up to it.
async fn prepare_job(
    work_dir: &Path,
    config_file: &Path,
    config: CruiseConfig,
    job_id: String,
) -> Result<Prepared, ResumeError> {
    let jobs_dir = work_dir.join("jobs");
    let history_dir = jobs_dir.join(HISTORY_DIR);
    let files = history::files(&history_dir, &job_id);
    let mut records = Vec::new();
    for f in &files {
        let rs = history::read(f).map_err(|e| ResumeError::Unreadable {
            path: f.display().to_string(),
            message: e.to_string(),
        })?;
        if rs
            .iter()
            .any(|r| matches!(r, Record::End { outcome, .. } if outcome == "finished"))
        {
            return Ok(Prepared::Finished {
                job_id,
                history: f.clone(),
            });
        }
        records.extend(rs);
    }

    if !config.checkpoint.enabled {
        return Err(ResumeError::CheckpointsOff {
            job_id,
            work_dir: work_dir.display().to_string(),
            config: config_file.display().to_string(),
        });
    }
    let dir = config.checkpoint.dir.clone();
    let fs = cruise_container::input_fs::file_system(&config.hdfs);
    let manifest = checkpoint::latest(&fs, &dir, &job_id)
        .await
        .map_err(|source| ResumeError::NoCheckpoint {
            job_id: job_id.clone(),
            work_dir: work_dir.display().to_string(),
            dir: dir.clone(),
            every_epochs: config.checkpoint.every_epochs,
            every_secs: config.checkpoint.every_secs,
            source: Box::new(source),
        })?;
    let folder = checkpoint::folder(&dir, manifest.id);
    let blocks = manifest
        .tables
        .iter()
        .find(|t| t.0 == MODEL_TABLE)
        .map_or(0, |t| t.1);
    if blocks != config.store.model_blocks {
        return Err(ResumeError::Mismatch {
            job_id,
            folder,
            message: format!(
                "it holds {blocks} model blocks, and store.model_blocks is {}",
                config.store.model_blocks
            ),
        });
    }
    // Every epoch evaluates the whole data set once (exact when the
    // checkpoint was taken at an epoch's end; a little above it otherwise).
    let per_epoch = manifest.records_done / u64::from(manifest.epoch.max(1));
    let epochs = carried_epochs(&records, manifest.epoch, per_epoch);
    let history_file = history::later_path(&jobs_dir, &job_id);
    // A torn checkpoint newer than the one resumed keeps its number: the
    // resumed job's checkpoints come after it, not into its folder.
    let highest = match checkpoint::highest_id(&fs, &dir).await {
        Ok(id) => id.unwrap_or(0),
        Err(e) => {
            tracing::warn!(
                "listing {dir} again to number the resumed job's checkpoints: {e}; \
                 numbering them after checkpoint {}",
                manifest.id
            );
            0
        }
    };
    let next_checkpoint = highest.max(manifest.id) + 1;
    Ok(Prepared::Resume {
        config: Box::new(config),
        resume: Box::new(Resume {
            job_id,
            manifest,
            folder,
            next_checkpoint,
            epochs,
            history_file,
        }),
    })
}

/// Epochs 1..=`upto` as the history `records` tell them (a later record of
/// an epoch wins: each attempt's history repeats those carried over), each
/// of `per_epoch` records with the history's mean loss and accuracy.
fn carried_epochs(records: &[Record], upto: u32, per_epoch: u64) -> Vec<EpochSummary> {
    let mut by_epoch: BTreeMap<u32, EpochSummary> = BTreeMap::new();
    for r in records {
        if let Record::Epoch {
            epoch,
            at_secs,
            secs,
            loss,
            accuracy,
            workers,
            servers,
            ..
        } = r
        {
            let n = per_epoch;
            let stats = Stats {
                records: n,
                loss_sum: loss * n as f64,
                loss_terms: 0,
                correct: accuracy.map_or(0, |a| (a * n as f64).round() as u64),
            };
            by_epoch.insert(
                *epoch,
                EpochSummary {
                    epoch: *epoch,
                    stats,
                    secs: *secs,
                    end_secs: *at_secs,
                    workers: *workers,
                    servers: *servers,
                },
            );
        }
    }
    (1..=upto)
        .map(|epoch| {
            by_epoch.remove(&epoch).unwrap_or(EpochSummary {
                epoch,
                stats: Stats::default(),
                secs: 0.0,
                end_secs: 0.0,
                workers: 0,
                servers: 0,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(n: u32, loss: f64) -> Record {
        Record::Epoch {
            epoch: n,
            at_secs: f64::from(n),
            secs: 1.0,
            loss,
            accuracy: Some(0.5),
            derived: None,
            workers: 2,
            servers: 1,
        }
    }

    #[test]
    fn epochs_are_carried_up_to_the_checkpoint_and_the_later_record_wins() {
        let records = vec![epoch(1, 3.0), epoch(2, 2.0), epoch(3, 1.0), epoch(2, 1.5)];
        let e = carried_epochs(&records, 2, 1000);
        assert_eq!(e[1].stats.records, 1000);
        assert_eq!(e.len(), 2);
        assert!((e[0].stats.mean_loss() - 3.0).abs() < 1e-9);
        assert!((e[1].stats.mean_loss() - 1.5).abs() < 1e-9);
        assert!((e[1].stats.accuracy() - 0.5).abs() < 1e-9);
        let missing = carried_epochs(&[], 1, 1000);
        assert_eq!(missing[0].epoch, 1);
    }

    #[tokio::test]
    async fn a_work_dir_without_a_job_or_checkpoint_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let e = prepare(dir.path()).await.unwrap_err().to_string();
        assert!(e.contains("no job configuration"), "{e}");
        assert!(e.contains(&dir.path().display().to_string()), "{e}");

        let jobs = dir.path().join("jobs");
        let mut config = CruiseConfig::default();
        config.checkpoint.dir = jobs
            .join("checkpoints")
            .join("job_1_a")
            .display()
            .to_string();
        persist_config(&jobs, "job_1_a", &config, "/data/in").unwrap();
        let e = prepare(dir.path()).await.unwrap_err().to_string();
        assert!(e.contains("cannot be resumed"), "{e}");
        assert!(e.contains("no usable checkpoint"), "{e}");
        assert!(e.contains("MANIFEST.json"), "{e}");

        std::fs::create_dir_all(jobs.join(HISTORY_DIR)).unwrap();
        std::fs::write(
            jobs.join(HISTORY_DIR).join("job_1_a.jsonl"),
            "{\"event\":\"end\",\"at_secs\":1.0,\"outcome\":\"finished\",\"error\":null,\
             \"final_loss\":null,\"final_accuracy\":null}\n",
        )
        .unwrap();
        assert!(matches!(
            prepare(dir.path()).await.unwrap(),
            Prepared::Finished { .. }
        ));
    }

    #[tokio::test]
    async fn a_later_attempt_resumes_unless_the_job_ended_or_has_no_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let job_toml = dir.path().join("job.toml");
        let mut config = CruiseConfig::default();
        let attempt = |config: &CruiseConfig| {
            prepare_attempt(dir.path(), &job_toml, "job_1_0001", config.clone())
        };
        // No checkpoint directory: nothing was checkpointed.
        let e = attempt(&config).await.unwrap_err();
        assert!(matches!(e, ResumeError::CheckpointsOff { .. }), "{e}");
        config.checkpoint.dir = dir.path().join("ckpt").display().to_string();
        let e = attempt(&config).await.unwrap_err();
        assert!(matches!(e, ResumeError::NoCheckpoint { .. }), "{e}");

        let history = dir.path().join("jobs").join(HISTORY_DIR);
        std::fs::create_dir_all(&history).unwrap();
        let end = |outcome: &str| {
            format!(
                "{{\"event\":\"end\",\"at_secs\":1.0,\"outcome\":\"{outcome}\",\
                 \"error\":\"evaluator 2 lost\",\"final_loss\":null,\"final_accuracy\":null}}\n"
            )
        };
        std::fs::write(history.join("job_1_0001.jsonl"), end("failed")).unwrap();
        let e = attempt(&config).await.unwrap_err().to_string();
        assert!(e.contains("ended failed in an earlier attempt"), "{e}");
        assert!(e.contains("evaluator 2 lost"), "{e}");
        std::fs::write(history.join("job_1_0001.jsonl"), end("finished")).unwrap();
        assert!(matches!(
            attempt(&config).await.unwrap(),
            Prepared::Finished { .. }
        ));
    }
}
