//! The file system the job reads its input through: the Hadoop
//! configuration from the environment and the WebHDFS client's limits and
//! timeouts from `[hdfs]`. The AM (input planning) and every evaluator
//! (loading splits) build theirs here, so both talk to HDFS alike.

use std::time::Duration;

use cruise_conf::HdfsConfig;
use cruise_hdfs::webhdfs::RetryPolicy;
use cruise_hdfs::{FileSystem, HadoopConf, WebHdfsOptions};

/// The WebHDFS options `[hdfs]` sets, with the user from the environment.
pub fn webhdfs_options(h: &HdfsConfig) -> WebHdfsOptions {
    let ms = Duration::from_millis;
    WebHdfsOptions {
        retry: RetryPolicy {
            max_attempts: h.retries,
            ..RetryPolicy::default()
        },
        connect_timeout: ms(h.connect_timeout_ms),
        request_timeout: Some(ms(h.request_timeout_ms)),
        read_timeout: Some(ms(h.read_timeout_ms)),
        deadline: Some(ms(h.deadline_ms)),
        max_response_bytes: h.max_response_bytes,
        max_list_entries: h.max_list_entries,
        ..WebHdfsOptions::from_env()
    }
}

/// The job's file system: `$HADOOP_CONF_DIR`'s configuration when it can be
/// read (none otherwise, with a warning) and the options of `[hdfs]`.
pub fn file_system(h: &HdfsConfig) -> FileSystem {
    let conf = HadoopConf::from_env().unwrap_or_else(|e| {
        tracing::warn!("ignoring the Hadoop configuration: {e}");
        HadoopConf::default()
    });
    FileSystem::new(conf, webhdfs_options(h))
}
