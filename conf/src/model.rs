//! The configuration model: one struct per TOML section, with defaults.
//!
//! Every field has a default so that `cruise run` works with no file at all.
//! Field documentation here is the reference; `conf/examples/local.toml` repeats
//! it for users.

use serde::{Deserialize, Serialize};

use crate::ConfError;

/// The whole configuration of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct CruiseConfig {
    /// What to train and how.
    pub job: JobConfig,
    /// Where containers come from.
    pub runtime: RuntimeConfig,
    /// Control channel and data plane framing.
    pub channel: ChannelConfig,
    /// Elastic store layout.
    pub store: StoreConfig,
    /// The AM's status endpoint.
    pub status: StatusConfig,
    /// Multinomial logistic regression.
    pub mlr: MlrConfig,
    /// Non-negative matrix factorisation.
    pub nmf: NmfConfig,
    /// Latent Dirichlet allocation.
    pub lda: LdaConfig,
    /// Lasso regression.
    pub lasso: LassoConfig,
    /// The self-configuring optimizer.
    pub optimizer: OptimizerConfig,
    /// The YARN runtime and `cruise submit`.
    pub yarn: YarnConfig,
    /// The Mesos runtime.
    pub mesos: MesosConfig,
    /// The WebHDFS client (input, staging).
    pub hdfs: HdfsConfig,
    /// An emulated cluster of unequal containers (local runtime).
    pub emulation: EmulationConfig,
    /// Periodic checkpoints of the model (a lost server's blocks come back
    /// from the last one).
    pub checkpoint: CheckpointConfig,
}

/// The ML application to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AppKind {
    /// Multinomial logistic regression (sparse, SGD).
    #[default]
    Mlr,
    /// Non-negative matrix factorisation (SGD, row factors on workers).
    Nmf,
    /// Latent Dirichlet allocation (collapsed Gibbs sampling, sparse sampler).
    Lda,
    /// Lasso regression (proximal SGD with soft-thresholding).
    Lasso,
}

impl AppKind {
    /// The name used on the command line and in files.
    pub fn as_str(self) -> &'static str {
        match self {
            AppKind::Mlr => "mlr",
            AppKind::Nmf => "nmf",
            AppKind::Lda => "lda",
            AppKind::Lasso => "lasso",
        }
    }

    /// Whether the app keeps worker-local state learned from its training
    /// input (NMF's row factors, LDA's document topics), so that the model
    /// alone cannot score other input.
    pub fn keeps_worker_state(self) -> bool {
        matches!(self, AppKind::Nmf | AppKind::Lda)
    }
}

impl std::fmt::Display for AppKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a scale-in does with the input blocks of the containers it gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ScaleInInput {
    /// Whichever is predicted faster: moving the blocks from the container
    /// that leaves (measured link capacity) or re-reading them from the input
    /// at their new owner (measured read-and-parse speed of the job's loads).
    #[default]
    Auto,
    /// Always move them.
    Move,
    /// Always re-read them (when the app keeps no worker-local state; else
    /// they move).
    Reload,
}

/// Whether a job's checkpoints are deleted once it has finished
/// successfully (`checkpoint.delete_on_success`). A job that failed or
/// was cancelled always keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DeleteCheckpoints {
    /// `cruise submit` deletes the checkpoints it placed in the
    /// application's staging directory (`checkpoint.dir` unset) and keeps
    /// those in a `checkpoint.dir` you set; `cruise run` keeps them. (Submit
    /// writes `always` or `never` into the job's configuration.)
    #[default]
    Auto,
    /// Delete them wherever they are: every checkpoint folder (`ckpt-<n>`)
    /// in `checkpoint.dir`, then the directory if nothing else is in it.
    Always,
    /// Keep them.
    Never,
}

/// How workers synchronise their progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// Workers never wait for each other (Cruise's default).
    #[default]
    Async,
    /// Stale-synchronous: a worker may be at most `job.staleness` epochs ahead of
    /// the slowest one; `staleness = 0` is bulk-synchronous.
    Ssp,
}

/// `[job]`: what to train and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobConfig {
    /// Human-readable job name (shown in logs and status).
    pub name: String,
    /// Application: `mlr`, `nmf`, `lda` or `lasso`.
    pub app: AppKind,
    /// Input path or URI (file, directory, `file://`, `hdfs://`, `webhdfs://`).
    /// Empty: generate a data set for the app into the work directory.
    pub input: String,
    /// Held-out input, in the app's input format: after training, the final
    /// model is also evaluated over it (reported as `eval_stats`). Only for
    /// apps without worker-local state (`mlr`, `lasso`). Empty: none.
    pub eval_input: String,
    /// File the AM writes the final model to after training (text: one line
    /// per key, `key v1 v2 ...`, after `#` header lines). Empty: not written.
    pub model_out: String,
    /// Work directory for generated data and evaluator logs. Empty: a
    /// `cruise` folder in the system's temporary directory.
    pub work_dir: String,
    /// Number of containers (evaluators) to start the job with.
    pub containers: u32,
    /// Initial number of workers; the rest are servers. 0: choose
    /// automatically (three quarters of the containers, at least one server).
    pub workers: u32,
    /// Number of training epochs (passes over the data set).
    pub epochs: u32,
    /// Records per mini-batch. Mini-batches do not span input blocks: a block
    /// is cut into `round(records / mini_batch)` of near-equal size.
    pub mini_batch: u32,
    /// `async` or `ssp`.
    pub sync: SyncMode,
    /// Staleness bound for `ssp`, in epochs (0 = bulk-synchronous).
    pub staleness: u32,
    /// Overlap communication with computation: a worker pulls the next
    /// mini-batches' keys while it computes on this one, and does not wait
    /// for a push to be acknowledged before going on (at most
    /// `pipeline_depth` of each in flight; all are flushed before a worker
    /// ends a local epoch or stops). The worker applies its own pushes that a
    /// pull has not seen yet to the pulled values, so only other workers'
    /// updates can be stale, as in any asynchronous PS. `false`: pull,
    /// compute, push and wait, one after the other (Cruise's model).
    pub pipeline: bool,
    /// With `pipeline`: mini-batches pulled ahead, and pushes left
    /// unacknowledged, at most (1–16). Deeper hides a longer round trip
    /// behind computation, but each pull then misses more of the other
    /// workers' pushes: with 3 workers (the default MLR job) final accuracy
    /// was 0.956–0.960 at 2 and 0.895–0.955 at 4. A worker that holds all
    /// the input (the only one) computes on the same values at any depth,
    /// since its own pushes are applied to what it pulls: it pulls at least
    /// 8 ahead.
    pub pipeline_depth: u32,
    /// Seed for data generation and model initialisation.
    pub seed: u64,
    /// Lost workers and servers the job survives while training (a
    /// worker's input is re-read by the surviving workers, a server's
    /// blocks restored from the newest checkpoint; LDA rebuilds its counts
    /// from the workers' assignments instead); one more fails the job,
    /// naming every loss. 0: the first loss fails the job.
    pub max_failures: u32,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            name: "cruise-job".to_string(),
            app: AppKind::Mlr,
            input: String::new(),
            eval_input: String::new(),
            model_out: String::new(),
            work_dir: String::new(),
            containers: 4,
            workers: 0,
            epochs: 5,
            mini_batch: 100,
            sync: SyncMode::Async,
            staleness: 0,
            pipeline: true,
            pipeline_depth: 2,
            seed: 42,
            max_failures: 3,
        }
    }
}

impl JobConfig {
    /// Mini-batches a worker keeps in flight as configured: `pipeline_depth`
    /// with `pipeline`, 0 without (before a lone worker's deepening).
    pub fn in_flight(&self) -> u32 {
        if self.pipeline {
            self.pipeline_depth
        } else {
            0
        }
    }

    /// The initial (workers, servers) split for `containers` containers.
    pub fn initial_split(&self) -> (u32, u32) {
        let n = self.containers;
        let w = if self.workers == 0 {
            n.saturating_sub((n / 4).max(1)).max(1)
        } else {
            self.workers
        };
        (w, n.saturating_sub(w))
    }
}

/// Which resource manager to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// Evaluator processes on this machine.
    #[default]
    Local,
    /// Evaluators in the containers of a YARN service (see `[yarn]`).
    Yarn,
    /// Evaluators as tasks of a Mesos framework (see `[mesos]`).
    Mesos,
}

impl RuntimeKind {
    /// The name used on the command line and in files.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Local => "local",
            RuntimeKind::Yarn => "yarn",
            RuntimeKind::Mesos => "mesos",
        }
    }
}

/// `[runtime]`: where containers come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// `local`, `yarn` or `mesos`.
    pub kind: RuntimeKind,
    /// Most containers the job may hold. Local runtime: its capacity (a
    /// capacity schedule may offer more). YARN and Mesos: an upper bound on
    /// what the cluster offers. 0: `job.containers` (the job never grows
    /// unless a capacity schedule offers more).
    pub max_containers: u32,
    /// Local runtime: capacity over time, `SECS:CONTAINERS,...` (e.g.
    /// `20:8,60:4`: 8 containers from 20 s after the start, 4 from 60 s), to
    /// exercise opportunistic resources. Empty: constant.
    pub capacity_schedule: String,
    /// When the capacity shrinks, how long the job has to give containers
    /// back before the resource manager kills the newest ones.
    pub reclaim_deadline_ms: u64,
    /// Memory asked for per container, in MiB.
    pub container_memory_mb: u32,
    /// Cores asked for per container.
    pub container_cores: u32,
    /// On release, how long an evaluator gets after SIGTERM before SIGKILL.
    pub release_grace_ms: u64,
    /// How long to wait for requested containers to register before failing.
    pub allocation_timeout_ms: u64,
    /// Command that starts an evaluator. Empty: this `cruise` executable with
    /// the `evaluator` subcommand.
    pub evaluator_command: Vec<String>,
    /// Address the AM's control port binds to; evaluators connect to it.
    /// Inside a YARN AM container a loopback or wildcard address is replaced
    /// by the node's address.
    pub am_bind: String,
    /// YARN and Mesos: attempts of a REST call before the resource manager
    /// is reported unreachable.
    pub rm_retries: u32,
    /// YARN and Mesos: wait before the first retry, doubled per retry (at
    /// most 5 s), milliseconds.
    pub rm_retry_backoff_ms: u64,
    /// YARN and Mesos: timeout of one REST call, milliseconds.
    pub rm_request_timeout_ms: u64,
    /// YARN and Mesos: most bytes of a REST answer (not of Mesos's event
    /// stream, whose records are bounded on their own).
    pub rm_max_response_bytes: u64,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            kind: RuntimeKind::Local,
            max_containers: 0,
            capacity_schedule: String::new(),
            reclaim_deadline_ms: 30_000,
            container_memory_mb: 1024,
            container_cores: 1,
            release_grace_ms: 5_000,
            allocation_timeout_ms: 60_000,
            evaluator_command: Vec::new(),
            am_bind: "127.0.0.1:0".to_string(),
            rm_retries: 5,
            rm_retry_backoff_ms: 200,
            rm_request_timeout_ms: 30_000,
            rm_max_response_bytes: 16 << 20,
        }
    }
}

impl RuntimeConfig {
    /// Most containers the job may hold at the start.
    pub fn effective_max_containers(&self, job: &JobConfig) -> u32 {
        if self.max_containers == 0 {
            job.containers
        } else {
            self.max_containers
        }
    }

    /// The capacity schedule: `(time after the start, containers)`, in order.
    pub fn capacity_schedule(&self) -> Result<Vec<(std::time::Duration, u32)>, ConfError> {
        let bad = |reason: String| ConfError::Invalid {
            key: "runtime.capacity_schedule".into(),
            reason,
        };
        let mut out: Vec<(std::time::Duration, u32)> = Vec::new();
        for item in self
            .capacity_schedule
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let (t, n) = item
                .split_once(':')
                .ok_or_else(|| bad(format!("entry {item:?} is not SECS:CONTAINERS")))?;
            let secs: f64 = t
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| bad(format!("time {t:?} in {item:?} is not a number of seconds")))?;
            let n: u32 = n.trim().parse().map_err(|_| {
                bad(format!(
                    "container count {n:?} in {item:?} is not a whole number"
                ))
            })?;
            if n < 2 {
                return Err(bad(format!("{item:?}: a job needs at least 2 containers")));
            }
            let at = std::time::Duration::from_secs_f64(secs);
            if out.last().is_some_and(|(prev, _)| *prev >= at) {
                return Err(bad(format!("times must increase; {item:?} does not")));
            }
            out.push((at, n));
        }
        Ok(out)
    }

    /// The most containers the job may ever hold (for sizing block counts).
    pub fn capacity_ceiling(&self, job: &JobConfig) -> u32 {
        let scheduled = self
            .capacity_schedule()
            .map(|s| s.iter().map(|x| x.1).max().unwrap_or(0))
            .unwrap_or(0);
        self.effective_max_containers(job).max(scheduled)
    }
}

/// `[optimizer]`: when and how the job reconfigures itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    /// Whether the job measures itself and reconfigures.
    pub enabled: bool,
    /// Measure, probe and decide as usual (snapshots, decisions in the log
    /// and the status), but carry out no plan the optimizer merely prefers:
    /// only those forced by reclaimed capacity. For watching what the
    /// optimizer would do, and for measuring a fixed configuration with
    /// the optimizer's own instruments (`bench-fidelity`).
    pub advise_only: bool,
    /// How often the optimizer looks at the metrics, milliseconds.
    pub interval_ms: u64,
    /// Least predicted relative gain in epoch time worth a reconfiguration.
    pub min_gain: f64,
    /// Mini-batches each worker must report (after warm-up) before planning.
    /// A straggler that has reported at least one stops holding the look
    /// once the median worker has reported four times as many.
    pub min_mini_batches: u32,
    /// Mini-batches of each worker not counted at its start (warm-up).
    pub warmup_mini_batches: u32,
    /// Samples in each moving average.
    pub window: u32,
    /// Operations of a plan run at once, at most.
    pub max_parallel: u32,
    /// Measurements of different containers within this relative spread of
    /// each other count as equal (noise, not heterogeneity).
    pub noise_tolerance: f64,
    /// The same for bandwidth measurements. On the emulated clusters of
    /// `bench-fidelity` one link's bulk probes spread ±4% over 14 runs; at
    /// 1.0 (2× apart counting as equal) links of 151 and 91 Mbit/s read as
    /// one, and the cost model lost which containers were better linked.
    pub bandwidth_noise_tolerance: f64,
    /// A reconfiguration runs only after this many consecutive looks propose
    /// one (to the split the latest proposed; 1: at once). Forced plans
    /// (capacity reclaimed) run at once.
    pub confirmations: u32,
    /// Before any plan ran: seconds to add a container (start, calibrate,
    /// register). Learned from real plans afterwards.
    pub prior_add_secs: f64,
    /// Before any plan ran: seconds to delete a container.
    pub prior_delete_secs: f64,
    /// Before any plan ran: seconds to switch a container's role.
    pub prior_switch_secs: f64,
    /// Before any plan ran: seconds per move, plus its bytes at
    /// `prior_move_link_share` of its links' probed speed.
    pub prior_move_secs: f64,
    /// Before any plan ran: the share of its links' probed speed a block
    /// move reaches (its links shared with the plan's other moves at their
    /// probed speeds). 1: the probes' speed is the best guess until a plan
    /// measures its own; above 1 if the probes read low.
    pub prior_move_link_share: f64,
    /// Bytes of each bulk transfer that measures link capacity when training
    /// starts and when a container joins; a fan-out probe (one container
    /// sending to all the others at once) sends about this many in all,
    /// to each in proportion to its link as the pairs measured it (at
    /// least 256 KiB to each in each of its three tries). 0: do not probe.
    pub probe_bytes: u64,
    /// How long training waits for the links to be measured before it
    /// starts, milliseconds: the first probes run on idle links (probes run
    /// while training share the links with it and read low). Training
    /// starts when every probe has answered or this has passed; the
    /// fan-out probes of the links the pairs leave open then get as long
    /// again. 0: do not wait (probe while training, pairs only). A
    /// container that joins later is probed while training goes on.
    pub probe_wait_ms: u64,
    /// Write the optimizer's input (a snapshot for `cruise plan`) to this file
    /// at every look, and the one each plan was decided from beside it
    /// (`snap.json` → `snap.plan-1.json`). Empty: do not write.
    pub snapshot_file: String,
    /// On scale-in, the input blocks of containers given back are `move`d
    /// to the workers that stay, `reload`ed from the job's input there, or
    /// (`auto`) whichever is predicted faster. Apps with worker-local state
    /// (nmf, lda) always move: their state is not in the input.
    pub scale_in_input: ScaleInInput,
    /// A reconfiguration still running after this many seconds is reported
    /// (on the console and in the log), with the operations it waits for
    /// and what for; again after every further such period.
    pub slow_plan_report_secs: f64,
    /// An operation of a plan still running after this many milliseconds
    /// fails, with what it was waiting for; the plan skips its dependents and
    /// the job goes on.
    pub op_timeout_ms: u64,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            enabled: true,
            advise_only: false,
            interval_ms: 2_000,
            min_gain: 0.05,
            min_mini_batches: 5,
            warmup_mini_batches: 3,
            window: 20,
            max_parallel: 4,
            noise_tolerance: 0.25,
            bandwidth_noise_tolerance: 0.25,
            confirmations: 2,
            prior_add_secs: 2.0,
            prior_delete_secs: 1.0,
            prior_switch_secs: 0.1,
            prior_move_secs: 0.05,
            prior_move_link_share: 1.0,
            probe_bytes: 4 << 20,
            probe_wait_ms: 10_000,
            snapshot_file: String::new(),
            scale_in_input: ScaleInInput::Auto,
            slow_plan_report_secs: 30.0,
            op_timeout_ms: 600_000,
        }
    }
}

/// `[yarn]`: the YARN runtime (evaluators in a YARN service) and
/// `cruise submit` (the AM in a YARN application).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct YarnConfig {
    /// ResourceManager web addresses (`host:port` or `http://host:port`;
    /// several for HA). Empty: `yarn.resourcemanager.webapp.address` (and the
    /// HA variants) from `$HADOOP_CONF_DIR/yarn-site.xml`.
    pub rm_addresses: Vec<String>,
    /// User for REST calls and HDFS (`user.name`, simple authentication).
    /// Empty: `$HADOOP_USER_NAME`, else the OS user.
    pub user: String,
    /// Queue of the application and of the evaluator service.
    pub queue: String,
    /// HDFS directory where `cruise submit` uploads the binary and the job
    /// configuration (one subdirectory per application). Empty:
    /// `/user/<user>/.cruise-staging` on the default file system.
    pub staging_dir: String,
    /// Evaluator services are named `<prefix>-<application or job number>`.
    pub service_name_prefix: String,
    /// Memory of the AM container, MiB.
    pub am_memory_mb: u32,
    /// Cores of the AM container.
    pub am_cores: u32,
    /// Attempts YARN makes to run the AM (capped by the cluster's
    /// `yarn.resourcemanager.am.max-attempts`, 2 by default). An attempt
    /// after the first resumes the job from its newest checkpoint (which
    /// `cruise submit` keeps in the staging directory unless
    /// `checkpoint.dir` is set), or starts it afresh when there is none
    /// yet; a job its AM failed or cancelled is not run again.
    pub max_app_attempts: u32,
    /// How often the evaluator service is polled for container changes,
    /// milliseconds.
    pub poll_interval_ms: u64,
    /// How often node capacity is polled, milliseconds.
    pub capacity_poll_interval_ms: u64,
    /// How often DECOMMISSIONING nodes are polled
    /// (`/ws/v1/cluster/nodes?states=DECOMMISSIONING`), milliseconds. The
    /// job's containers on such a node (matched by host) are given back
    /// before the node's `decommissioningTimeout`: a forced plan empties and
    /// releases them. A node that returns to RUNNING cancels nothing already
    /// planned.
    pub decommission_poll_interval_ms: u64,
    /// The notice assumed for a DECOMMISSIONING node that reports no
    /// `decommissioningTimeout` (the field is optional), seconds. Hadoop's
    /// own default graceful-decommission timeout is 3600.
    pub decommission_default_timeout_secs: u64,
    /// `yarn.scheduler.minimum-allocation-mb` (requests are rounded up to a
    /// multiple of it). 0: from yarn-site.xml, else 1024.
    pub min_allocation_mb: u32,
    /// Lifetime of the evaluator service in seconds, counted from its
    /// creation (the AM does not renew it: a job that runs longer loses
    /// its evaluators), a backstop should the AM die without destroying
    /// it. 0: unlimited, the default, also for `cruise submit`: there the
    /// evaluators of an AM that is gone stop the service themselves once
    /// the RM says its application is over.
    pub service_lifetime_secs: u64,
    /// A tarball (`hdfs://.../cruise.tar`) holding the `cruise` binary at its
    /// top level, unpacked into `lib/` of each evaluator container. Empty:
    /// the evaluator command runs as is on the node. `cruise submit` sets it.
    pub evaluator_artifact: String,
    /// A local jar with `cruise.hadoop.AmRegistrar` (built by
    /// `integration/hadoop`). With it, `cruise submit` ships the jar and runs
    /// the AM under it: it registers the AM with the ResourceManager over
    /// Hadoop RPC, heartbeats, and unregisters with SUCCEEDED or FAILED from
    /// the AM's exit status. Real YARN needs this: an AM that never
    /// registers stays ACCEPTED, is expired after
    /// `yarn.am.liveness-monitor.expiry-interval-ms` and ends FAILED. The AM
    /// container's class path is `yarn.application.classpath` from
    /// yarn-site.xml (else Hadoop's default). Empty: the AM runs directly
    /// (cruise-sim, which has no AM RPC).
    pub am_register_jar: String,
}

impl Default for YarnConfig {
    fn default() -> Self {
        YarnConfig {
            rm_addresses: Vec::new(),
            user: String::new(),
            queue: "default".to_string(),
            staging_dir: String::new(),
            service_name_prefix: "cruise".to_string(),
            am_memory_mb: 1024,
            am_cores: 1,
            max_app_attempts: 2,
            poll_interval_ms: 500,
            capacity_poll_interval_ms: 5_000,
            decommission_poll_interval_ms: 5_000,
            decommission_default_timeout_secs: 3_600,
            min_allocation_mb: 0,
            service_lifetime_secs: 0,
            evaluator_artifact: String::new(),
            am_register_jar: String::new(),
        }
    }
}

/// `[mesos]`: the Mesos runtime (evaluators as tasks of a framework).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MesosConfig {
    /// Master address(es): `host:port` or `http://host:port`, several
    /// separated by commas. A non-leading master redirects to the leader.
    pub master: String,
    /// The role resources are offered for.
    pub role: String,
    /// The user tasks run as. Empty: the OS user.
    pub user: String,
    /// The framework's name.
    pub framework_name: String,
    /// How long the master keeps the framework's tasks after losing its
    /// connection, seconds.
    pub failover_timeout_secs: f64,
    /// How long declined offers stay away, seconds.
    pub refuse_seconds: f64,
    /// Heartbeats that may be missed before subscribing again.
    pub missed_heartbeats: u32,
    /// A URI each agent fetches (made executable) to run the evaluator, e.g.
    /// `http://host/cruise`. Empty: the evaluator command runs as is.
    pub evaluator_uri: String,
}

impl Default for MesosConfig {
    fn default() -> Self {
        MesosConfig {
            master: String::new(),
            role: "*".to_string(),
            user: String::new(),
            framework_name: "cruise".to_string(),
            failover_timeout_secs: 300.0,
            refuse_seconds: 5.0,
            missed_heartbeats: 5,
            evaluator_uri: String::new(),
        }
    }
}

impl MesosConfig {
    /// The master addresses.
    pub fn masters(&self) -> Vec<String> {
        self.master
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(String::from)
            .collect()
    }
}

/// `[checkpoint]`: periodic checkpoints of the model, taken while training
/// goes on (each server copies each of its blocks under that block's own
/// lock and writes it, and for NMF each worker its input blocks' row
/// factors; the AM then publishes a manifest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Take checkpoints. `false`: none, and a lost server fails the job.
    pub enabled: bool,
    /// Where: a local directory, `file://`, `hdfs://` or `webhdfs://` (every
    /// evaluator must reach it: on YARN or Mesos use HDFS). Each checkpoint
    /// is a folder `ckpt-<n>` in it; the last two are kept. Empty:
    /// `<work dir>/checkpoints/<job id>` on the local runtime,
    /// `<staging dir>/<application id>/checkpoints` for a job of `cruise
    /// submit`; with `cruise run` on YARN and Mesos no checkpoints are taken
    /// unless it is set.
    pub dir: String,
    /// Take one every this many epochs (0: not by epochs).
    pub every_epochs: u32,
    /// Take one when this many seconds of training have passed since the
    /// last (0: not by time). With both set, whichever comes first.
    pub every_secs: u64,
    /// Whether the checkpoints are deleted once the job has finished
    /// successfully: `auto` (those `cruise submit` placed in the
    /// application's staging directory, not a `checkpoint.dir` you set;
    /// `cruise run` keeps them), `always` (wherever they are) or `never`.
    /// A job that failed or was cancelled keeps them and says where.
    pub delete_on_success: DeleteCheckpoints,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            enabled: true,
            dir: String::new(),
            every_epochs: 0,
            every_secs: 120,
            delete_on_success: DeleteCheckpoints::Auto,
        }
    }
}

/// `[hdfs]`: how the WebHDFS client talks to namenodes and datanodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HdfsConfig {
    /// TCP connect timeout, milliseconds.
    pub connect_timeout_ms: u64,
    /// Timeout of one request, its whole body included, milliseconds.
    pub request_timeout_ms: u64,
    /// Longest silence while waiting for an answer or the next bytes of a
    /// body, milliseconds.
    pub read_timeout_ms: u64,
    /// Time budget of one operation with all its retries, milliseconds.
    pub deadline_ms: u64,
    /// Attempts of one operation, the first included.
    pub retries: u32,
    /// Most bytes of a JSON answer (a listing, a status) or an error body.
    pub max_response_bytes: u64,
    /// Most entries of one directory listing.
    pub max_list_entries: u64,
}

impl Default for HdfsConfig {
    fn default() -> Self {
        HdfsConfig {
            connect_timeout_ms: 5_000,
            request_timeout_ms: 60_000,
            read_timeout_ms: 20_000,
            deadline_ms: 90_000,
            retries: 4,
            max_response_bytes: 64 << 20,
            max_list_entries: 1_000_000,
        }
    }
}

/// When to compress frame payloads with lz4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Compress large payloads when a sample of them compresses well.
    #[default]
    Auto,
    /// Compress every payload above the size threshold.
    Always,
    /// Never compress.
    Never,
}

/// `[channel]`: framing and liveness of the control channel and data plane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChannelConfig {
    /// Largest frame accepted on the control channel (AM ⇄ evaluator), bytes.
    pub control_max_frame_bytes: u64,
    /// Largest frame accepted on the data plane (evaluator ⇄ evaluator), bytes.
    pub data_max_frame_bytes: u64,
    /// `auto`, `always` or `never`.
    pub compression: Compression,
    /// Payloads smaller than this are never compressed, bytes.
    pub compress_min_bytes: u64,
    /// With `auto`: compress only if a sample shrinks to at most this fraction.
    pub compress_max_ratio: f64,
    /// How often each side sends a heartbeat, milliseconds.
    pub heartbeat_interval_ms: u64,
    /// Silence after which the peer is declared dead, milliseconds.
    pub heartbeat_timeout_ms: u64,
    /// Timeout for connecting and authenticating, milliseconds.
    pub connect_timeout_ms: u64,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            control_max_frame_bytes: 16 << 20,
            data_max_frame_bytes: 256 << 20,
            compression: Compression::Auto,
            compress_min_bytes: 64 << 10,
            compress_max_ratio: 0.5,
            heartbeat_interval_ms: 1_000,
            heartbeat_timeout_ms: 10_000,
            connect_timeout_ms: 10_000,
        }
    }
}

/// `[store]`: how tables are split into blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Blocks of the model table (hashed key ranges).
    pub model_blocks: u32,
    /// Blocks of the input table (record ranges, one input split each).
    /// 0: eight per container of `runtime.max_containers`.
    pub input_blocks: u32,
    /// Chunk size for streaming a block during a move, bytes.
    pub move_chunk_bytes: u64,
    /// Longest an evaluator waits for another evaluator's answer to a data
    /// request (a pull, a push, a handover) or for a moved block to be
    /// installed, milliseconds. Past it the connection is given up: its
    /// requests fail with an error naming the evaluator and the wait.
    pub request_timeout_ms: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            model_blocks: 64,
            input_blocks: 0,
            move_chunk_bytes: 4 << 20,
            request_timeout_ms: 60_000,
        }
    }
}

impl StoreConfig {
    /// The number of input blocks to use when the job may hold up to
    /// `max_containers` containers.
    pub fn input_blocks_for(&self, max_containers: u32) -> u32 {
        if self.input_blocks == 0 {
            (max_containers * 8).max(8)
        } else {
            self.input_blocks
        }
    }
}

/// How the local runtime emulates unequal containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum EmulationMechanism {
    /// `kernel` when running as root with `ip`, `tc` and a cgroup `cpu`
    /// controller; `process` otherwise.
    #[default]
    Auto,
    /// A network namespace per container on a bridge, `tc` token-bucket
    /// filters for its bandwidth and a cgroup CPU quota for its share.
    /// Fails the job if this machine cannot do it.
    Kernel,
    /// Throttling inside each evaluator: worker compute is stretched to the
    /// CPU share and data-plane reads and writes are paced to the bandwidth.
    Process,
}

impl EmulationMechanism {
    /// The name used in files and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            EmulationMechanism::Auto => "auto",
            EmulationMechanism::Kernel => "kernel",
            EmulationMechanism::Process => "process",
        }
    }
}

/// One emulated container: its CPU share and its link's bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmulatedContainer {
    /// Cores it may use (0.25 = a quarter of a core); `None`: unlimited.
    pub cpu: Option<f64>,
    /// Its link's bandwidth in each direction, bits per second; `None`:
    /// unlimited.
    pub bits_per_sec: Option<f64>,
}

/// `[emulation]`: an emulated cluster of unequal containers on the local
/// runtime, so that the optimizer measures heterogeneity rather than being
/// told about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmulationConfig {
    /// CPU share and bandwidth of each container, in the order the local
    /// runtime starts them (the first `job.workers` start as workers):
    /// comma-separated `[COUNT*]CPU[/BANDWIDTH]` items, e.g.
    /// `"2*0.3/400mbit, 6*0.15/100mbit"`. CPU is in cores, BANDWIDTH a
    /// number with `kbit`, `mbit` or `gbit` (per second, each direction);
    /// `-` for either means unlimited. Containers started after the list is
    /// used up take it from the start again. Empty: no emulation.
    pub containers: String,
    /// `auto`, `kernel` or `process` (see [`EmulationMechanism`]).
    pub mechanism: EmulationMechanism,
    /// Kernel mechanism: the private IPv4 /24 of the bridge (the AM listens
    /// on its `.1`) and of the containers' namespaces. Pick one nothing else
    /// on this machine uses.
    pub subnet: String,
    /// Kernel mechanism: the CPU quota period, microseconds. Short periods
    /// spread a container's share evenly over short computations.
    pub cpu_period_us: u64,
}

impl Default for EmulationConfig {
    fn default() -> Self {
        EmulationConfig {
            containers: String::new(),
            mechanism: EmulationMechanism::Auto,
            subnet: "10.78.0.0/24".to_string(),
            cpu_period_us: 10_000,
        }
    }
}

impl EmulationConfig {
    /// Whether emulation is asked for.
    pub fn enabled(&self) -> bool {
        !self.containers.trim().is_empty()
    }

    /// The emulated containers, in start order (counts expanded).
    pub fn parsed(&self) -> Result<Vec<EmulatedContainer>, ConfError> {
        let bad = |reason: String| ConfError::Invalid {
            key: "emulation.containers".into(),
            reason,
        };
        let mut out = Vec::new();
        for item in self
            .containers
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let (count, shape) = match item.split_once('*') {
                Some((n, rest)) => {
                    let n: usize = n.trim().parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        bad(format!(
                            "count {n:?} in {item:?} is not a positive whole number"
                        ))
                    })?;
                    (n, rest.trim())
                }
                None => (1, item),
            };
            let (cpu, bw) = match shape.split_once('/') {
                Some((c, b)) => (c.trim(), Some(b.trim())),
                None => (shape, None),
            };
            let cpu = match cpu {
                "-" => None,
                c => Some(
                    c.parse::<f64>()
                        .ok()
                        .filter(|v| v.is_finite() && *v > 0.0 && *v <= 1024.0)
                        .ok_or_else(|| {
                            bad(format!(
                                "CPU share {c:?} in {item:?} is not a number of cores in (0, 1024] or -"
                            ))
                        })?,
                ),
            };
            let bits_per_sec = match bw {
                None | Some("-") => None,
                Some(b) => Some(parse_bits_per_sec(b).ok_or_else(|| {
                    bad(format!(
                        "bandwidth {b:?} in {item:?} is not like 100mbit, 1.5gbit or 800kbit (at least 100kbit), or -"
                    ))
                })?),
            };
            out.extend(std::iter::repeat_n(
                EmulatedContainer { cpu, bits_per_sec },
                count,
            ));
        }
        Ok(out)
    }

    /// The kernel mechanism's subnet: its first three octets.
    pub fn subnet_prefix(&self) -> Result<[u8; 3], ConfError> {
        let bad = |reason: String| ConfError::Invalid {
            key: "emulation.subnet".into(),
            reason,
        };
        let (net, len) = self
            .subnet
            .split_once('/')
            .ok_or_else(|| bad(format!("{:?} is not like 10.78.0.0/24", self.subnet)))?;
        let ip: std::net::Ipv4Addr = net
            .trim()
            .parse()
            .map_err(|_| bad(format!("{:?} is not like 10.78.0.0/24", self.subnet)))?;
        if len.trim() != "24" {
            return Err(bad(format!(
                "{:?}: only /24 subnets are supported",
                self.subnet
            )));
        }
        let o = ip.octets();
        if o[3] != 0 {
            return Err(bad(format!(
                "{:?} is not a network address (it must end in .0)",
                self.subnet
            )));
        }
        if !ip.is_private() {
            return Err(bad(format!(
                "{:?} is not a private range (10/8, 172.16/12, 192.168/16): the emulated cluster must not take addresses that may exist elsewhere",
                self.subnet
            )));
        }
        Ok([o[0], o[1], o[2]])
    }
}

/// `100mbit` → 1e8 bits per second (`kbit`, `mbit`, `gbit`; at least 100 kbit/s).
fn parse_bits_per_sec(text: &str) -> Option<f64> {
    let t = text.trim().to_ascii_lowercase();
    let (num, scale) = [("kbit", 1e3), ("mbit", 1e6), ("gbit", 1e9)]
        .into_iter()
        .find_map(|(unit, scale)| t.strip_suffix(unit).map(|n| (n.trim().to_string(), scale)))?;
    let v: f64 = num.parse().ok()?;
    let bits = v * scale;
    (bits.is_finite() && bits >= 1e5).then_some(bits)
}

/// `[status]`: the AM's status endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatusConfig {
    /// Address the AM's status port binds to: the web UI, `/status`,
    /// `/history` and `/metrics` (loopback unless you mean it). Empty: none.
    pub bind: String,
}

impl Default for StatusConfig {
    fn default() -> Self {
        StatusConfig {
            bind: "127.0.0.1:0".to_string(),
        }
    }
}

/// `[mlr]`: multinomial logistic regression.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MlrConfig {
    /// Number of classes; labels are 0..classes-1.
    pub classes: u32,
    /// Number of features; feature indices are 1..=features (libsvm, 1-based)
    /// or 0..features-1 when the data uses 0.
    pub features: u32,
    /// Initial SGD step size.
    pub step_size: f64,
    /// Step size decay per epoch: step = step_size / (1 + decay * epoch).
    pub decay: f64,
    /// L2 regularisation strength.
    pub l2: f64,
    /// Features per model key (a key holds the weights of that many features
    /// for all classes). 0: choose automatically.
    pub features_per_key: u32,
    /// Samples in the generated data set (used when `job.input` is empty).
    pub generate_samples: u64,
    /// Average non-zero features per generated sample.
    pub generate_nnz: u32,
}

impl Default for MlrConfig {
    fn default() -> Self {
        MlrConfig {
            classes: 10,
            features: 1_000,
            step_size: 10.0,
            decay: 0.1,
            l2: 1e-5,
            features_per_key: 0,
            generate_samples: 20_000,
            generate_nnz: 40,
        }
    }
}

/// `[nmf]`: non-negative matrix factorisation `X ≈ L·R` by SGD.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NmfConfig {
    /// Number of columns; column indices are 0..columns-1.
    pub columns: u32,
    /// Rank of the factorisation (floats per row and per column factor).
    pub rank: u32,
    /// Initial SGD step size.
    pub step_size: f64,
    /// Step size decay per epoch: step = step_size / (1 + decay * epoch).
    pub decay: f64,
    /// L2 regularisation of both factors, applied per observed entry.
    pub l2: f64,
    /// Initial factor values are uniform in [0, init_scale).
    pub init_scale: f64,
    /// Rows of the generated matrix (used when `job.input` is empty).
    pub generate_rows: u64,
    /// Fraction of entries observed in the generated matrix.
    pub generate_density: f64,
    /// Standard deviation of the Gaussian noise added to generated entries.
    pub generate_noise: f64,
}

impl Default for NmfConfig {
    fn default() -> Self {
        NmfConfig {
            columns: 500,
            rank: 8,
            step_size: 0.05,
            decay: 0.05,
            l2: 1e-3,
            init_scale: 0.5,
            generate_rows: 2_000,
            generate_density: 0.2,
            generate_noise: 0.1,
        }
    }
}

/// `[lda]`: latent Dirichlet allocation by collapsed Gibbs sampling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LdaConfig {
    /// Number of topics.
    pub topics: u32,
    /// Vocabulary size; word ids are 0..vocab-1.
    pub vocab: u32,
    /// Symmetric Dirichlet prior of document-topic distributions.
    pub alpha: f64,
    /// Symmetric Dirichlet prior of topic-word distributions.
    pub beta: f64,
    /// Documents in the generated corpus (used when `job.input` is empty).
    pub generate_docs: u64,
    /// Mean tokens per generated document.
    pub generate_doc_len: u32,
}

impl Default for LdaConfig {
    fn default() -> Self {
        LdaConfig {
            topics: 20,
            vocab: 2_000,
            alpha: 0.1,
            beta: 0.01,
            generate_docs: 5_000,
            generate_doc_len: 100,
        }
    }
}

/// `[lasso]`: L1-regularised least squares by proximal SGD.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LassoConfig {
    /// Number of features; libsvm indices are 1..=features (0 is accepted too).
    pub features: u32,
    /// L1 penalty λ of the objective 0.5·mean squared error + λ·‖w‖₁
    /// (scikit-learn's `alpha`).
    pub lambda: f64,
    /// Initial SGD step size.
    pub step_size: f64,
    /// Step size decay per epoch: step = step_size / (1 + decay * epoch).
    pub decay: f64,
    /// Features per model key. 0: choose automatically.
    pub features_per_key: u32,
    /// Samples in the generated data set (used when `job.input` is empty).
    pub generate_samples: u64,
    /// Non-zero coefficients of the generated ground truth.
    pub generate_support: u32,
    /// Standard deviation of the Gaussian noise added to generated targets.
    pub generate_noise: f64,
}

impl Default for LassoConfig {
    fn default() -> Self {
        LassoConfig {
            features: 100,
            lambda: 0.05,
            step_size: 0.05,
            decay: 0.1,
            features_per_key: 0,
            generate_samples: 5_000,
            generate_support: 10,
            generate_noise: 0.5,
        }
    }
}

impl CruiseConfig {
    /// Check the configuration as a whole. Errors name the key at fault.
    pub fn validate(&self) -> Result<(), ConfError> {
        let bad = |key: &str, reason: String| {
            Err(ConfError::Invalid {
                key: key.to_string(),
                reason,
            })
        };
        let job = &self.job;
        if job.containers < 2 {
            return bad(
                "job.containers",
                format!(
                    "is {}, but a job needs at least 2 (one worker and one server)",
                    job.containers
                ),
            );
        }
        if self.runtime.max_containers != 0 && job.containers > self.runtime.max_containers {
            return bad(
                "job.containers",
                format!(
                    "is {}, more than runtime.max_containers = {}",
                    job.containers, self.runtime.max_containers
                ),
            );
        }
        self.runtime.capacity_schedule()?;
        self.validate_emulation()?;
        let ck = &self.checkpoint;
        if ck.enabled && ck.every_epochs == 0 && ck.every_secs == 0 {
            return bad(
                "checkpoint.every_epochs",
                "and checkpoint.every_secs are both 0: set one, or checkpoint.enabled = false"
                    .into(),
            );
        }
        let o = &self.optimizer;
        if !(o.min_gain >= 0.0 && o.min_gain < 1.0) {
            return bad(
                "optimizer.min_gain",
                format!("is {}, must be in [0, 1)", o.min_gain),
            );
        }
        if o.interval_ms == 0 {
            return bad("optimizer.interval_ms", "must be at least 1".to_string());
        }
        if o.window == 0 {
            return bad("optimizer.window", "must be at least 1".to_string());
        }
        if !(o.noise_tolerance >= 0.0 && o.noise_tolerance.is_finite()) {
            return bad(
                "optimizer.noise_tolerance",
                format!("is {}, must be >= 0", o.noise_tolerance),
            );
        }
        if !(o.bandwidth_noise_tolerance >= 0.0 && o.bandwidth_noise_tolerance.is_finite()) {
            return bad(
                "optimizer.bandwidth_noise_tolerance",
                format!("is {}, must be >= 0", o.bandwidth_noise_tolerance),
            );
        }
        for (key, v) in [
            ("optimizer.prior_add_secs", o.prior_add_secs),
            ("optimizer.prior_delete_secs", o.prior_delete_secs),
            ("optimizer.prior_switch_secs", o.prior_switch_secs),
            ("optimizer.prior_move_secs", o.prior_move_secs),
        ] {
            if !(v >= 0.0 && v.is_finite()) {
                return bad(key, format!("is {v}, must be >= 0"));
            }
        }
        if o.op_timeout_ms < 100 {
            return bad(
                "optimizer.op_timeout_ms",
                format!("{} is below 100", o.op_timeout_ms),
            );
        }
        if !(o.slow_plan_report_secs > 0.0 && o.slow_plan_report_secs.is_finite()) {
            return bad(
                "optimizer.slow_plan_report_secs",
                format!("is {}, must be positive", o.slow_plan_report_secs),
            );
        }
        if !(o.prior_move_link_share > 0.0 && o.prior_move_link_share.is_finite()) {
            return bad(
                "optimizer.prior_move_link_share",
                format!("is {}, must be positive", o.prior_move_link_share),
            );
        }
        if o.confirmations == 0 {
            return bad("optimizer.confirmations", "must be at least 1".to_string());
        }
        if o.max_parallel == 0 {
            return bad("optimizer.max_parallel", "must be at least 1".to_string());
        }
        let (w, s) = job.initial_split();
        if w == 0 || s == 0 {
            return bad(
                "job.workers",
                format!(
                    "is {}, but with job.containers = {} that leaves {} workers and {} servers; \
                     both must be at least 1",
                    job.workers, job.containers, w, s
                ),
            );
        }
        if job.epochs == 0 {
            return bad("job.epochs", "must be at least 1".to_string());
        }
        if job.mini_batch == 0 {
            return bad("job.mini_batch", "must be at least 1".to_string());
        }
        if !(1..=16).contains(&job.pipeline_depth) {
            return bad(
                "job.pipeline_depth",
                format!("is {}, but must be from 1 to 16", job.pipeline_depth),
            );
        }
        if job.staleness > 0 && job.sync == SyncMode::Async {
            return bad(
                "job.staleness",
                "is set but job.sync is \"async\"; set job.sync = \"ssp\" to use a staleness bound"
                    .to_string(),
            );
        }
        let ch = &self.channel;
        if ch.control_max_frame_bytes < 4096 {
            return bad(
                "channel.control_max_frame_bytes",
                "must be at least 4096".to_string(),
            );
        }
        if ch.data_max_frame_bytes < 65536 {
            return bad(
                "channel.data_max_frame_bytes",
                "must be at least 65536".to_string(),
            );
        }
        if !(0.0..=1.0).contains(&ch.compress_max_ratio) {
            return bad(
                "channel.compress_max_ratio",
                format!("is {}, must be between 0 and 1", ch.compress_max_ratio),
            );
        }
        if ch.heartbeat_interval_ms == 0 || ch.heartbeat_timeout_ms <= ch.heartbeat_interval_ms {
            return bad(
                "channel.heartbeat_timeout_ms",
                format!(
                    "is {} ms; it must be larger than channel.heartbeat_interval_ms = {} ms (> 0)",
                    ch.heartbeat_timeout_ms, ch.heartbeat_interval_ms
                ),
            );
        }
        if self.store.model_blocks == 0 {
            return bad("store.model_blocks", "must be at least 1".to_string());
        }
        if self.store.request_timeout_ms < 100 {
            return bad(
                "store.request_timeout_ms",
                format!("{} is below 100", self.store.request_timeout_ms),
            );
        }
        if self.store.move_chunk_bytes < 4096
            || self.store.move_chunk_bytes > ch.data_max_frame_bytes / 2
        {
            return bad(
                "store.move_chunk_bytes",
                format!(
                    "is {}; it must be at least 4096 and at most half of channel.data_max_frame_bytes",
                    self.store.move_chunk_bytes
                ),
            );
        }
        if self
            .runtime
            .evaluator_command
            .first()
            .is_some_and(|p| p.is_empty())
        {
            return bad(
                "runtime.evaluator_command",
                "has an empty program name".to_string(),
            );
        }
        if self
            .runtime
            .am_bind
            .parse::<std::net::SocketAddr>()
            .is_err()
        {
            return bad(
                "runtime.am_bind",
                format!(
                    "{:?} is not an address like 127.0.0.1:0",
                    self.runtime.am_bind
                ),
            );
        }
        if !self.status.bind.is_empty() && self.status.bind.parse::<std::net::SocketAddr>().is_err()
        {
            return bad(
                "status.bind",
                format!(
                    "{:?} is not an address like 127.0.0.1:8080",
                    self.status.bind
                ),
            );
        }
        if self.runtime.rm_retries == 0 {
            return bad("runtime.rm_retries", "must be at least 1".to_string());
        }
        let h = &self.hdfs;
        for (key, v) in [
            ("hdfs.connect_timeout_ms", h.connect_timeout_ms),
            ("hdfs.request_timeout_ms", h.request_timeout_ms),
            ("hdfs.read_timeout_ms", h.read_timeout_ms),
            ("hdfs.deadline_ms", h.deadline_ms),
            ("hdfs.max_list_entries", h.max_list_entries),
        ] {
            if v == 0 {
                return bad(key, "must be above 0".into());
            }
        }
        if h.retries == 0 {
            return bad("hdfs.retries", "must be at least 1".into());
        }
        if h.max_response_bytes < 4096 {
            return bad(
                "hdfs.max_response_bytes",
                format!("{} is below 4096", h.max_response_bytes),
            );
        }
        if self.runtime.rm_max_response_bytes < 4096 {
            return bad(
                "runtime.rm_max_response_bytes",
                format!("{} is below 4096", self.runtime.rm_max_response_bytes),
            );
        }
        if self.runtime.rm_request_timeout_ms == 0 {
            return bad(
                "runtime.rm_request_timeout_ms",
                "must be at least 1".to_string(),
            );
        }
        let y = &self.yarn;
        let prefix_ok = !y.service_name_prefix.is_empty()
            && y.service_name_prefix.len() <= 40
            && y.service_name_prefix.as_bytes()[0].is_ascii_lowercase()
            && y.service_name_prefix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !prefix_ok {
            return bad(
                "yarn.service_name_prefix",
                format!(
                    "{:?} must start with a lowercase letter, use only a-z, 0-9 and '-', and have at most 40 characters",
                    y.service_name_prefix
                ),
            );
        }
        if y.am_memory_mb == 0 || y.am_cores == 0 {
            return bad(
                "yarn.am_memory_mb",
                "yarn.am_memory_mb and yarn.am_cores must be at least 1".to_string(),
            );
        }
        if y.max_app_attempts == 0 {
            return bad("yarn.max_app_attempts", "must be at least 1".to_string());
        }
        if y.poll_interval_ms == 0 || y.capacity_poll_interval_ms == 0 {
            return bad(
                "yarn.poll_interval_ms",
                "yarn.poll_interval_ms and yarn.capacity_poll_interval_ms must be at least 1"
                    .to_string(),
            );
        }
        if y.decommission_poll_interval_ms == 0 {
            return bad(
                "yarn.decommission_poll_interval_ms",
                "must be at least 1".to_string(),
            );
        }
        let me = &self.mesos;
        if self.runtime.kind == RuntimeKind::Mesos && me.masters().is_empty() {
            return bad(
                "mesos.master",
                "is empty; runtime.kind = \"mesos\" needs the master's HOST:PORT (--master)"
                    .to_string(),
            );
        }
        if me.role.is_empty() || me.framework_name.is_empty() {
            return bad(
                "mesos.role",
                "mesos.role and mesos.framework_name must not be empty".to_string(),
            );
        }
        if !(me.failover_timeout_secs >= 0.0 && me.failover_timeout_secs.is_finite()) {
            return bad(
                "mesos.failover_timeout_secs",
                format!("is {}, must be >= 0", me.failover_timeout_secs),
            );
        }
        if !(me.refuse_seconds >= 0.0 && me.refuse_seconds.is_finite()) {
            return bad(
                "mesos.refuse_seconds",
                format!("is {}, must be >= 0", me.refuse_seconds),
            );
        }
        if me.missed_heartbeats == 0 {
            return bad("mesos.missed_heartbeats", "must be at least 1".to_string());
        }
        let m = &self.mlr;
        if m.classes < 2 {
            return bad(
                "mlr.classes",
                format!("is {}, must be at least 2", m.classes),
            );
        }
        if m.features == 0 {
            return bad("mlr.features", "must be at least 1".to_string());
        }
        if !(m.step_size > 0.0 && m.step_size.is_finite()) {
            return bad(
                "mlr.step_size",
                format!("is {}, must be positive", m.step_size),
            );
        }
        if !(m.decay >= 0.0 && m.decay.is_finite()) {
            return bad("mlr.decay", format!("is {}, must be >= 0", m.decay));
        }
        if !(m.l2 >= 0.0 && m.l2.is_finite()) {
            return bad("mlr.l2", format!("is {}, must be >= 0", m.l2));
        }
        if m.generate_nnz == 0 || m.generate_nnz > m.features {
            return bad(
                "mlr.generate_nnz",
                format!(
                    "is {}, must be between 1 and mlr.features = {}",
                    m.generate_nnz, m.features
                ),
            );
        }
        self.validate_apps()?;
        if !job.eval_input.is_empty() && job.app.keeps_worker_state() {
            return bad(
                "job.eval_input",
                format!(
                    "is set, but app {} keeps per-record state learned in training \
                     (row factors or document topics), so its model cannot score other \
                     input; held-out evaluation is supported for mlr and lasso",
                    job.app
                ),
            );
        }
        Ok(())
    }

    fn validate_emulation(&self) -> Result<(), ConfError> {
        let e = &self.emulation;
        let bad = |key: &str, reason: String| {
            Err(ConfError::Invalid {
                key: key.to_string(),
                reason,
            })
        };
        e.parsed()?;
        e.subnet_prefix()?;
        if !(1_000..=1_000_000).contains(&e.cpu_period_us) {
            return bad(
                "emulation.cpu_period_us",
                format!(
                    "is {}, must be between 1000 and 1000000 (the kernel's limits)",
                    e.cpu_period_us
                ),
            );
        }
        if e.enabled() && self.runtime.kind != RuntimeKind::Local {
            return bad(
                "emulation.containers",
                format!(
                    "is set, but only the local runtime can emulate containers; runtime.kind = \"{}\" runs on a real cluster (leave emulation.containers empty)",
                    self.runtime.kind.as_str()
                ),
            );
        }
        Ok(())
    }

    fn validate_apps(&self) -> Result<(), ConfError> {
        let bad = |key: &str, reason: String| {
            Err(ConfError::Invalid {
                key: key.to_string(),
                reason,
            })
        };
        let positive = |key: &str, v: f64| {
            if v > 0.0 && v.is_finite() {
                Ok(())
            } else {
                bad(key, format!("is {v}, must be positive"))
            }
        };
        let non_negative = |key: &str, v: f64| {
            if v >= 0.0 && v.is_finite() {
                Ok(())
            } else {
                bad(key, format!("is {v}, must be >= 0"))
            }
        };
        let at_least_1 = |key: &str, v: u64| {
            if v >= 1 {
                Ok(())
            } else {
                bad(key, "must be at least 1".to_string())
            }
        };

        let n = &self.nmf;
        at_least_1("nmf.columns", u64::from(n.columns))?;
        at_least_1("nmf.rank", u64::from(n.rank))?;
        if n.rank > 4096 {
            return bad("nmf.rank", format!("is {}, must be at most 4096", n.rank));
        }
        positive("nmf.step_size", n.step_size)?;
        non_negative("nmf.decay", n.decay)?;
        non_negative("nmf.l2", n.l2)?;
        positive("nmf.init_scale", n.init_scale)?;
        if !(n.generate_density > 0.0 && n.generate_density <= 1.0) {
            return bad(
                "nmf.generate_density",
                format!("is {}, must be in (0, 1]", n.generate_density),
            );
        }
        non_negative("nmf.generate_noise", n.generate_noise)?;

        let l = &self.lda;
        if !(2..=65_535).contains(&l.topics) {
            return bad(
                "lda.topics",
                format!("is {}, must be between 2 and 65535", l.topics),
            );
        }
        at_least_1("lda.vocab", u64::from(l.vocab))?;
        positive("lda.alpha", l.alpha)?;
        positive("lda.beta", l.beta)?;
        at_least_1("lda.generate_doc_len", u64::from(l.generate_doc_len))?;

        let a = &self.lasso;
        at_least_1("lasso.features", u64::from(a.features))?;
        non_negative("lasso.lambda", a.lambda)?;
        positive("lasso.step_size", a.step_size)?;
        non_negative("lasso.decay", a.decay)?;
        if a.generate_support > a.features {
            return bad(
                "lasso.generate_support",
                format!(
                    "is {}, must be at most lasso.features = {}",
                    a.generate_support, a.features
                ),
            );
        }
        non_negative("lasso.generate_noise", a.generate_noise)?;
        Ok(())
    }
}
