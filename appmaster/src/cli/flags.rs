//! Flags several commands share: the configuration flags ([`ConfFlags`],
//! with the app, runtime and synchronisation choices) of `run`, `submit`
//! and `config`, and the cluster flags ([`ClusterFlags`]) of `status`,
//! `kill` and `logs`; each builds the configuration it describes.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use cruise_conf::{CruiseConfig, Layers};

/// Configuration flags shared by commands that build a configuration.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfFlags {
    /// TOML configuration file (see conf/examples/local.toml for every key).
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Application to train.
    #[arg(long, value_enum)]
    pub app: Option<AppArg>,
    /// Input file, directory or URI (file://, hdfs://, webhdfs://).
    /// Default: generate a data set into the work directory.
    #[arg(short, long, value_name = "PATH")]
    pub input: Option<String>,
    /// Held-out input (same format): the final model is also evaluated over
    /// it and reported as eval_stats (mlr and lasso).
    #[arg(long, value_name = "PATH")]
    pub eval_input: Option<String>,
    /// Write the final model to this file (text: `key v1 v2 ...` per line).
    #[arg(long, value_name = "FILE")]
    pub model_out: Option<PathBuf>,
    /// Containers (evaluators) to start with.
    #[arg(short = 'n', long, value_name = "N")]
    pub containers: Option<u32>,
    /// Initial workers; the other containers are servers.
    #[arg(short, long, value_name = "W")]
    pub workers: Option<u32>,
    /// Training epochs.
    #[arg(short, long, value_name = "E")]
    pub epochs: Option<u32>,
    /// Records per mini-batch.
    #[arg(short = 'b', long, value_name = "B")]
    pub mini_batch: Option<u32>,
    /// Synchronisation: async, or ssp (stale-synchronous; see --staleness).
    #[arg(long, value_enum)]
    pub sync: Option<SyncArg>,
    /// SSP staleness bound in epochs (0 = bulk-synchronous). Implies --sync ssp.
    #[arg(long, value_name = "S")]
    pub staleness: Option<u32>,
    /// Work directory for generated data and container logs.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Where containers come from: local, yarn or mesos.
    #[arg(long, value_enum)]
    pub runtime: Option<RuntimeArg>,
    /// Mesos master HOST:PORT (several separated by commas); implies
    /// --runtime mesos unless another runtime is given.
    #[arg(long, value_name = "HOST:PORT")]
    pub master: Option<String>,
    /// Set any configuration key, e.g. --set mlr.step_size=0.2 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// Applications.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum AppArg {
    /// Multinomial logistic regression.
    Mlr,
    /// Non-negative matrix factorisation.
    Nmf,
    /// Latent Dirichlet allocation.
    Lda,
    /// Lasso regression.
    Lasso,
}

/// Runtimes.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeArg {
    /// Evaluator processes on this machine.
    Local,
    /// Containers of a YARN service.
    Yarn,
    /// Tasks of a Mesos framework.
    Mesos,
}

/// Synchronisation modes.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum SyncArg {
    /// Workers never wait.
    Async,
    /// Stale-synchronous parallel.
    Ssp,
}

impl ConfFlags {
    /// Builds the configuration from defaults, file, environment and these flags.
    pub fn load(&self) -> Result<CruiseConfig, cruise_conf::ConfError> {
        let mut l = Layers::from_process_env(self.config.clone());
        if let Some(a) = self.app {
            l.set("job.app", format!("{a:?}").to_lowercase(), "--app");
        }
        if let Some(v) = &self.input {
            l.set("job.input", v, "--input");
        }
        if let Some(v) = &self.eval_input {
            l.set("job.eval_input", v, "--eval-input");
        }
        if let Some(v) = &self.model_out {
            l.set("job.model_out", v.display(), "--model-out");
        }
        if let Some(v) = self.containers {
            l.set("job.containers", v, "--containers");
        }
        if let Some(v) = self.workers {
            l.set("job.workers", v, "--workers");
        }
        if let Some(v) = self.epochs {
            l.set("job.epochs", v, "--epochs");
        }
        if let Some(v) = self.mini_batch {
            l.set("job.mini_batch", v, "--mini-batch");
        }
        if let Some(v) = self.sync {
            l.set("job.sync", format!("{v:?}").to_lowercase(), "--sync");
        }
        if let Some(v) = self.staleness {
            if self.sync.is_none() {
                l.set("job.sync", "ssp", "--staleness");
            }
            l.set("job.staleness", v, "--staleness");
        }
        if let Some(v) = &self.work_dir {
            l.set("job.work_dir", v.display(), "--work-dir");
        }
        match (self.runtime, &self.master) {
            (Some(r), _) => l.set("runtime.kind", format!("{r:?}").to_lowercase(), "--runtime"),
            (None, Some(_)) => l.set("runtime.kind", "mesos", "--master"),
            (None, None) => {}
        }
        if let Some(m) = &self.master {
            l.set("mesos.master", m, "--master");
        }
        for s in &self.set {
            l.set_text(s)?;
        }
        l.load()
    }
}

/// Flags that find the cluster for `status`, `kill` and `logs`.
#[derive(Args, Debug, Clone, Default)]
pub struct ClusterFlags {
    /// TOML configuration file (its yarn section is used).
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// ResourceManager web address (repeatable for HA). Default:
    /// yarn.rm_addresses, else HADOOP_CONF_DIR/yarn-site.xml.
    #[arg(long = "rm", value_name = "HOST:PORT")]
    pub rm: Vec<String>,
    /// Set any configuration key, e.g. --set yarn.user=alice (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl ClusterFlags {
    /// The configuration these flags describe.
    pub fn load(&self) -> Result<CruiseConfig, cruise_conf::ConfError> {
        let mut l = Layers::from_process_env(self.config.clone());
        if !self.rm.is_empty() {
            let list: Vec<String> = self.rm.iter().map(|r| format!("{r:?}")).collect();
            l.set(
                "yarn.rm_addresses",
                format!("[{}]", list.join(", ")),
                "--rm",
            );
        }
        for s in &self.set {
            l.set_text(s)?;
        }
        l.load()
    }
}
