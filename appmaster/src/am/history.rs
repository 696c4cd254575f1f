//! The job's history: what happened, as records appended while it runs.
//!
//! The job's loop sends a [`Record`] for each thing worth keeping (the
//! job's start, every change of its members' roles, every epoch, every
//! decision of the optimizer, every plan's start and end, the job's end).
//! One writer ([`spawn_writer`]) owns the history: it appends each record
//! as a line of JSON to `history/<job id>.jsonl` in the job's work
//! directory (a later run of the same job, resumed or started afresh by a
//! later YARN attempt, to `history/<job id>.resume-<n>.jsonl`: no run
//! overwrites another's), flushed at once, and publishes the records on a
//! watch channel for the web UI. The loop never waits for the file.
//! [`read`] reads such a file back for `cruise report`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio_util::task::TaskTracker;

use super::AmError;

/// The directory, under a job's work directory, of the history files.
pub const HISTORY_DIR: &str = "history";

/// One thing that happened to a job. Times are seconds after the job
/// started (the clock of the epochs and the plans).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Record {
    /// The job started.
    Job {
        /// Job id.
        job_id: String,
        /// The app (`mlr`, `nmf`, `lda`, `lasso`).
        app: String,
        /// Name of the app's loss.
        loss_name: String,
        /// Whether accuracy is meaningful.
        has_accuracy: bool,
        /// Epochs to train.
        epochs: u32,
        /// Containers to start with.
        containers: u32,
        /// The runtime (`local`, `yarn`, `mesos`).
        runtime: String,
        /// Wall-clock start, milliseconds since the Unix epoch.
        started_unix_ms: u64,
    },
    /// The members or their roles changed.
    Members {
        /// When.
        at_secs: f64,
        /// Every member now.
        members: Vec<Member>,
    },
    /// An epoch ended.
    Epoch {
        /// 1-based epoch number.
        epoch: u32,
        /// When it ended.
        at_secs: f64,
        /// Its wall time, seconds.
        secs: f64,
        /// Training loss over its mini-batches.
        loss: f64,
        /// Training accuracy, if the app has one.
        accuracy: Option<f64>,
        /// The app's derived metric (name and value: RMSE, perplexity), if any.
        derived: Option<(String, f64)>,
        /// Workers at its end.
        workers: u32,
        /// Servers at its end.
        servers: u32,
    },
    /// SSP: a lost server's model blocks were restored from a checkpoint,
    /// and the workers' clocks and the job's progress went back to it: the
    /// epochs after `epoch` are trained again (their records follow).
    Rollback {
        /// When.
        at_secs: f64,
        /// The job's rollbacks so far, this one included.
        rollback: u32,
        /// The clock every worker goes on from.
        clock: u32,
        /// Epochs done from now on.
        epoch: u32,
        /// Records done from now on.
        records_done: u64,
        /// Epochs done before it.
        from_epoch: u32,
        /// Records done before it.
        from_records: u64,
        /// The slowest worker's clock before it.
        from_clock: u32,
        /// The checkpoint's folder.
        checkpoint: String,
    },
    /// The optimizer's decision changed, in words.
    Decision {
        /// When.
        at_secs: f64,
        /// What it decided.
        text: String,
    },
    /// The optimizer's last look: the predicted epoch time of each split.
    Splits {
        /// When.
        at_secs: f64,
        /// `(workers, servers, predicted epoch seconds)`, best first.
        splits: Vec<(u32, u32, f64)>,
    },
    /// A plan started.
    PlanStarted {
        /// Its number (1-based).
        plan: usize,
        /// When.
        at_secs: f64,
        /// What it changes and why.
        summary: String,
        /// Predicted epoch time before, seconds.
        predicted_before_secs: f64,
        /// Predicted epoch time after, seconds.
        predicted_after_secs: f64,
        /// Forced by reclaimed capacity.
        forced: bool,
    },
    /// A plan ended.
    PlanEnded {
        /// Its number (1-based).
        plan: usize,
        /// When.
        at_secs: f64,
        /// Its wall time, seconds.
        secs: f64,
        /// Its operations.
        ops: Vec<OpRecord>,
    },
    /// The containers as the job ended (the report's containers table).
    Containers {
        /// When.
        at_secs: f64,
        /// One row per evaluator.
        rows: Vec<ContainerRow>,
    },
    /// The job ended.
    End {
        /// When.
        at_secs: f64,
        /// `finished`, `failed` or `cancelled`.
        outcome: String,
        /// Why it failed, if it did.
        error: Option<String>,
        /// Loss of the final model over all input (post-training
        /// evaluation), if it got that far.
        final_loss: Option<f64>,
        /// Its accuracy, if the app has one.
        final_accuracy: Option<f64>,
    },
}

/// A member of the job at some moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Evaluator id.
    pub id: u32,
    /// Its container.
    pub container: String,
    /// `worker`, `server`, `idle` or `leaving`.
    pub role: String,
}

/// One evaluator in the containers table, as measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerRow {
    /// Evaluator id.
    pub id: u32,
    /// Its container.
    pub container: String,
    /// Its host.
    pub host: String,
    /// `worker`, `server` or `idle`.
    pub role: String,
    /// Its process id.
    pub pid: u32,
    /// Input blocks held.
    pub input_blocks: u32,
    /// Model blocks held.
    pub model_blocks: u32,
    /// Bytes of blocks held.
    pub store_bytes: u64,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
    /// Compute seconds per record (smoothed).
    pub compute_secs_per_record: Option<f64>,
    /// Pull and push round trips per mini-batch, seconds (smoothed).
    pub comm_secs_per_mini_batch: Option<f64>,
    /// Wall seconds per mini-batch (smoothed).
    pub batch_secs_per_mini_batch: Option<f64>,
    /// Bytes exchanged per mini-batch (smoothed).
    pub bytes_per_mini_batch: Option<f64>,
    /// Its CPU speed from the calibration.
    pub cpu_speed: Option<f64>,
    /// Its link capacity, bytes per second (the fastest bulk transfer it
    /// took part in).
    pub link_bytes_per_sec: Option<f64>,
    /// Mini-batches it ran in all.
    pub mini_batches: u64,
    /// Bytes it pulled and pushed in all.
    pub bytes: u64,
    /// Requests it served in all.
    pub requests: u64,
}

/// One operation of a plan, as it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpRecord {
    /// `add`, `delete`, `switch`, `move input`, `move model`, `reload input`.
    pub kind: String,
    /// What it did (containers, blocks).
    pub what: String,
    /// `succeeded`, `failed` or `skipped`.
    pub outcome: String,
    /// When it started, seconds after its plan started (`None`: never).
    pub start_secs: Option<f64>,
    /// How long it ran, seconds.
    pub secs: f64,
    /// Bytes it moved.
    pub bytes: u64,
    /// Why it failed or was skipped.
    pub error: Option<String>,
}

/// The loop's end of the history: appends records, stamped with the job's
/// clock.
#[derive(Clone)]
pub struct HistoryLog {
    tx: mpsc::UnboundedSender<Record>,
    started: Instant,
}

impl HistoryLog {
    /// A log that goes nowhere (tests of the loop without a writer).
    pub fn discard(started: Instant) -> Self {
        let (tx, _) = mpsc::unbounded_channel();
        HistoryLog { tx, started }
    }

    /// When the job started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Seconds since the job started.
    pub fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Appends `record`. After the writer has gone (the job is over) it is
    /// dropped.
    pub fn push(&self, record: Record) {
        let _ = self.tx.send(record);
    }
}

/// The records so far, as the web UI reads them.
pub type Published = Arc<Vec<Record>>;

/// The history file of job `job_id`'s first run under `work_dir` (a job's
/// work directory, `<work dir>/jobs`).
pub fn path(work_dir: &Path, job_id: &str) -> PathBuf {
    work_dir.join(HISTORY_DIR).join(format!("{job_id}.jsonl"))
}

/// The history file of a later run of job `job_id` (resumed, or started
/// afresh by a later YARN attempt) under `work_dir`: the first
/// `<job id>.resume-<n>.jsonl` that does not exist yet, so that no run
/// overwrites an earlier run's history.
pub fn later_path(work_dir: &Path, job_id: &str) -> PathBuf {
    let dir = work_dir.join(HISTORY_DIR);
    let run = |n: u32| dir.join(format!("{job_id}.resume-{n}.jsonl"));
    (1..)
        .map(run)
        .find(|f| !f.exists())
        .unwrap_or_else(|| run(u32::MAX))
}

/// The history file a run of job `job_id` that starts it (not resumed)
/// writes: [`path`], unless an earlier run of the job wrote it (a later
/// YARN attempt with no checkpoint to resume from starts the job afresh
/// under the same id), then [`later_path`].
pub fn fresh_path(work_dir: &Path, job_id: &str) -> PathBuf {
    let first = path(work_dir, job_id);
    if first.exists() {
        later_path(work_dir, job_id)
    } else {
        first
    }
}

/// The history files of job `job_id` in `history_dir`, earliest run
/// first: `<job id>.jsonl`, then `<job id>.resume-<n>.jsonl` by `n`.
pub fn files(history_dir: &Path, job_id: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(history_dir) else {
        return Vec::new();
    };
    let first = format!("{job_id}.jsonl");
    let prefix = format!("{job_id}.resume-");
    let mut found: Vec<(u32, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let run = if name == first {
                0
            } else {
                name.strip_prefix(&prefix)?
                    .strip_suffix(".jsonl")?
                    .parse()
                    .ok()?
            };
            Some((run, e.path()))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

/// Starts the writer of job `job_id`'s history at `file` on `tracker`'s
/// blocking pool: it ends when every [`HistoryLog`] is dropped, after
/// writing what they sent. Returns the loop's end and the published records.
pub fn spawn_writer(
    file: &Path,
    started: Instant,
    published: watch::Sender<Published>,
    tracker: &TaskTracker,
) -> Result<HistoryLog, AmError> {
    let io = |context: String| move |source| AmError::Io { context, source };
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    }
    let mut out = std::fs::File::create(file)
        .map_err(io(format!("creating the job's history {}", file.display())))?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Record>();
    let name = file.display().to_string();
    tracker.spawn_blocking(move || {
        let mut failed = false;
        while let Some(record) = rx.blocking_recv() {
            if !failed {
                let line = serde_json::to_string(&record).map(|mut l| {
                    l.push('\n');
                    l
                });
                let written = match line {
                    Ok(l) => out.write_all(l.as_bytes()).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                if let Err(e) = written {
                    tracing::warn!(
                        "cannot write the job's history {name}: {e}; no more is written"
                    );
                    failed = true;
                }
            }
            published.send_modify(|v| Arc::make_mut(v).push(record));
        }
    });
    Ok(HistoryLog { tx, started })
}

/// Errors reading a history file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// It cannot be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A line is not a record.
    #[error("{path}:{line}: not a history record: {message}")]
    Malformed {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// No history file where one was looked for.
    #[error("no job history (*.jsonl) in {0}")]
    NotFound(String),
}

/// Reads a history file; a last line cut short (a job killed mid-write) is
/// left out.
pub fn read(file: &Path) -> Result<Vec<Record>, ReadError> {
    let text = std::fs::read_to_string(file).map_err(|source| ReadError::Io {
        path: file.display().to_string(),
        source,
    })?;
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(r) => out.push(r),
            Err(_) if i + 1 == lines.len() && !complete => {}
            Err(e) => {
                return Err(ReadError::Malformed {
                    path: file.display().to_string(),
                    line: i + 1,
                    message: e.to_string(),
                });
            }
        }
    }
    Ok(out)
}

/// The history file `dir` names: `dir` itself if it is a file, else the
/// newest `*.jsonl` in `dir/jobs/history`, `dir/history` or `dir`.
pub fn find(dir: &Path) -> Result<PathBuf, ReadError> {
    if dir.is_file() {
        return Ok(dir.to_path_buf());
    }
    let candidates = [
        dir.join("jobs").join(HISTORY_DIR),
        dir.join(HISTORY_DIR),
        dir.to_path_buf(),
    ];
    for d in candidates {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        let newest = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .max();
        if let Some((_, p)) = newest {
            return Ok(p);
        }
    }
    Err(ReadError::NotFound(dir.display().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(n: u32) -> Record {
        Record::Epoch {
            epoch: n,
            at_secs: f64::from(n),
            secs: 1.0,
            loss: 0.5,
            accuracy: Some(0.9),
            derived: None,
            workers: 3,
            servers: 1,
        }
    }

    #[tokio::test]
    async fn the_writer_appends_lines_and_publishes_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path(), "job_1");
        let (ptx, prx) = watch::channel(Published::default());
        let tracker = TaskTracker::new();
        let log = spawn_writer(&file, Instant::now(), ptx, &tracker).unwrap();
        log.push(epoch(1));
        log.push(epoch(2));
        drop(log);
        tracker.close();
        tracker.wait().await;
        assert_eq!(read(&file).unwrap(), vec![epoch(1), epoch(2)]);
        assert_eq!(*prx.borrow().clone(), vec![epoch(1), epoch(2)]);
        assert_eq!(find(dir.path()).unwrap(), file);
    }

    /// A later run of a job that starts it afresh (a YARN attempt with no
    /// checkpoint) keeps the earlier run's history and writes its own; a
    /// resumed run after it writes the next one. `cruise report` finds
    /// the newest, and every one is still there to read.
    #[tokio::test]
    async fn every_run_of_a_job_keeps_its_own_history() {
        let dir = tempfile::tempdir().unwrap();
        let run = |file: PathBuf, records: Vec<Record>| async move {
            let (ptx, _prx) = watch::channel(Published::default());
            let tracker = TaskTracker::new();
            let log = spawn_writer(&file, Instant::now(), ptx, &tracker).unwrap();
            for r in records {
                log.push(r);
            }
            drop(log);
            tracker.close();
            tracker.wait().await;
            file
        };
        let first = run(fresh_path(dir.path(), "job_1"), vec![epoch(1), epoch(2)]).await;
        assert_eq!(first, path(dir.path(), "job_1"));
        let again = run(fresh_path(dir.path(), "job_1"), vec![epoch(1)]).await;
        assert_eq!(
            again.file_name().unwrap().to_string_lossy(),
            "job_1.resume-1.jsonl"
        );
        let resumed = run(later_path(dir.path(), "job_1"), vec![epoch(2)]).await;
        assert_eq!(
            resumed.file_name().unwrap().to_string_lossy(),
            "job_1.resume-2.jsonl"
        );
        // Another job's history is not this job's.
        run(fresh_path(dir.path(), "job_2"), vec![epoch(9)]).await;

        let history = dir.path().join(HISTORY_DIR);
        assert_eq!(
            files(&history, "job_1"),
            vec![first.clone(), again.clone(), resumed.clone()]
        );
        assert_eq!(read(&first).unwrap(), vec![epoch(1), epoch(2)]);
        assert_eq!(read(&again).unwrap(), vec![epoch(1)]);
        assert_eq!(read(&resumed).unwrap(), vec![epoch(2)]);
        assert_eq!(files(&history, "job_2").len(), 1);
    }

    #[test]
    fn history_files_come_in_attempt_order() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "job_1_a.resume-2.jsonl",
            "job_1_a.jsonl",
            "job_1_a.resume-10.jsonl",
            "job_2_b.jsonl",
        ] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let names: Vec<String> = files(dir.path(), "job_1_a")
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "job_1_a.jsonl",
                "job_1_a.resume-2.jsonl",
                "job_1_a.resume-10.jsonl"
            ]
        );
    }

    #[test]
    fn a_line_cut_short_at_the_end_is_left_out_and_one_in_the_middle_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("h.jsonl");
        let good = serde_json::to_string(&epoch(1)).unwrap();
        std::fs::write(&file, format!("{good}\n{{\"event\":\"epo")).unwrap();
        assert_eq!(read(&file).unwrap(), vec![epoch(1)]);
        std::fs::write(&file, format!("{{\"event\":\"epo\n{good}\n")).unwrap();
        let e = read(&file).unwrap_err().to_string();
        assert!(e.contains("h.jsonl:1:"), "{e}");
    }
}
