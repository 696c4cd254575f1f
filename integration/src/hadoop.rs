//! The real one-machine Hadoop of `integration/hadoop/` (Hadoop's own
//! MiniDFSCluster and MiniYARNCluster), as the end-to-end tests and
//! benchmarks find it: `CRUISE_HADOOP_DIR` names the directory its
//! `start.sh DIR` wrote, with `cluster.env` (the addresses) and `hadoop-conf/`
//! (a `HADOOP_CONF_DIR`).
//!
//! Without `CRUISE_HADOOP_DIR` the tests that need it print why they are
//! skipped and pass; with `CRUISE_HADOOP_REQUIRED=1` (as in CI) they fail
//! instead, so a cluster that did not start cannot pass unnoticed.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, bail};

/// A running real Hadoop.
#[derive(Debug, Clone)]
pub struct RealHadoop {
    /// The directory given to `start.sh`.
    pub dir: PathBuf,
    /// Its `HADOOP_CONF_DIR`.
    pub conf_dir: PathBuf,
    /// The NameNode's HTTP (WebHDFS) address, `host:port`.
    pub nn_http: String,
    /// The NameNode's RPC address, `host:port` (the `hdfs://` authority).
    pub nn_rpc: String,
    /// The ResourceManager's web address, `host:port`.
    pub rm_web: String,
    /// The jar with `cruise.hadoop.AmRegistrar` (`yarn.am_register_jar`).
    pub am_register_jar: String,
    /// Every variable of `cluster.env`.
    pub env: BTreeMap<String, String>,
}

impl RealHadoop {
    /// The cluster named by `CRUISE_HADOOP_DIR`; `Ok(None)` when that is not
    /// set and `CRUISE_HADOOP_REQUIRED` is not either (after printing that
    /// `test` is skipped and how to run it).
    pub fn from_env(test: &str) -> anyhow::Result<Option<RealHadoop>> {
        let dir = match std::env::var_os("CRUISE_HADOOP_DIR").filter(|d| !d.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => {
                if std::env::var_os("CRUISE_HADOOP_REQUIRED").is_some_and(|v| v == "1") {
                    bail!(
                        "{test}: CRUISE_HADOOP_REQUIRED=1 but CRUISE_HADOOP_DIR is not set \
                         (start the cluster with integration/hadoop/start.sh DIR)"
                    );
                }
                eprintln!(
                    "SKIPPED {test}: no real Hadoop (start one with `integration/hadoop/start.sh DIR` \
                     and set CRUISE_HADOOP_DIR=DIR)"
                );
                return Ok(None);
            }
        };
        RealHadoop::open(dir).map(Some)
    }

    /// The cluster started by `start.sh dir`.
    pub fn open(dir: PathBuf) -> anyhow::Result<RealHadoop> {
        let env_file = dir.join("cluster.env");
        let text = std::fs::read_to_string(&env_file).with_context(|| {
            format!(
                "reading {} (is the cluster of integration/hadoop/start.sh {} running?)",
                env_file.display(),
                dir.display()
            )
        })?;
        let env: BTreeMap<String, String> = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let get = |k: &str| {
            env.get(k)
                .cloned()
                .with_context(|| format!("{} has no {k}", env_file.display()))
        };
        Ok(RealHadoop {
            conf_dir: dir.join("hadoop-conf"),
            nn_http: get("NN_HTTP")?,
            nn_rpc: get("NN_RPC")?,
            rm_web: get("RM_WEB")?,
            am_register_jar: get("AM_REGISTER_JAR")?,
            env,
            dir,
        })
    }

    /// `http://<rm>`.
    pub fn rm_url(&self) -> String {
        format!("http://{}", self.rm_web)
    }

    /// `http://<namenode http>`.
    pub fn webhdfs_url(&self) -> String {
        format!("http://{}", self.nn_http)
    }

    /// The launcher's log, for failure messages (its last `lines` lines).
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join("hadoop.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}
