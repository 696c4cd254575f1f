//! The AM as a YARN application: `cruise submit` (stage the binary and the
//! job configuration on HDFS, submit the AM container), `cruise appmaster`
//! (the AM inside that container), and `cruise status|kill|logs APP_ID`.
//!
//! What `submit` puts in the staging directory `<staging>/<application id>/`:
//! - `cruise.tar`: the running `cruise` binary at its top level and the
//!   client's Hadoop configuration in `hadoop-conf/`. The AM container gets
//!   it as the ARCHIVE local resource `lib`, and every evaluator container as
//!   the service component's TARBALL artifact, which YARN also unpacks into
//!   `lib/` — so both run `./lib/cruise` with
//!   `HADOOP_CONF_DIR={{PWD}}/lib/hadoop-conf`.
//! - `job.toml`: the effective configuration (runtime `yarn`, the input, the
//!   RM addresses, the artifact), the FILE local resource `job.toml`.
//! - `input/`: the input, when it was generated or local.
//!
//! The AM command is `./lib/cruise appmaster --config job.toml` with stdout
//! and stderr in the container's log directory; with `yarn.am_register_jar`
//! it runs under `java cruise.hadoop.AmRegistrar` (the jar shipped as the
//! FILE resource `cruise-am-registrar.jar`), which registers it with the RM
//! over Hadoop RPC, as real YARN requires; the AM prints its summary
//! there and writes `summary.json`, which `cruise logs` fetches from the
//! NodeManager. The evaluator service is named after the application
//! (`<prefix>-<cluster timestamp>-<sequence>`), so `cruise kill` can destroy
//! it even when the AM cannot.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use serde::Serialize;

use cruise_conf::{CruiseConfig, DeleteCheckpoints, Layers, RuntimeKind};
use cruise_hdfs::{FileSystem, Location, is_hidden};
use cruise_rm::yarn::ARTIFACT_DIR;
use cruise_rm::yarn::rm::{
    AppReport, LocalResource, Resource, ResourceType, RmClient, Submission,
    application_of_container, attempt_of_container, parse_application_id,
};
use cruise_rm::yarn::services::{ServiceReport, ServicesClient};

use crate::runtime::{
    HADOOP_CONF_IN_TARBALL, YarnPlacement, YarnSettings, hadoop_conf, http_options,
    service_name_for_app, yarn_factory, yarn_settings,
};
use crate::{datagen, tarball};

/// Name of the tarball in the staging directory.
pub const TARBALL: &str = "cruise.tar";
/// Name of the job configuration (staging directory and AM container).
pub const JOB_TOML: &str = "job.toml";
/// Name of `yarn.am_register_jar` in the staging directory and the AM
/// container.
pub const AM_REGISTER_JAR: &str = "cruise-am-registrar.jar";
/// The job's checkpoints in the staging directory, unless
/// `checkpoint.dir` is set.
pub const CHECKPOINT_DIR: &str = "checkpoints";
/// The AM's work directory in the application's local directory.
pub const AM_WORK_DIR: &str = "cruise-am";
/// Name of the AM's summary file in its log directory.
pub const SUMMARY_FILE: &str = "summary.json";

/// What `cruise submit` did.
#[derive(Debug, Clone, Serialize)]
pub struct Submitted {
    /// The YARN application.
    pub application_id: String,
    /// Where its files are.
    pub staging_dir: String,
    /// The input the job reads.
    pub input: String,
    /// The evaluator service the AM will create.
    pub service: String,
    /// The RM it was submitted to.
    pub rm: String,
}

fn clients(config: &CruiseConfig, s: &YarnSettings) -> anyhow::Result<(RmClient, ServicesClient)> {
    let http = http_options(config);
    Ok((
        RmClient::new(&s.rm_addresses, Some(s.user.clone()), http.clone())?,
        ServicesClient::new(&s.rm_addresses, Some(s.user.clone()), http)?,
    ))
}

fn file_system(config: &CruiseConfig, user: &str) -> anyhow::Result<FileSystem> {
    let conf = hadoop_conf()?;
    Ok(FileSystem::new(
        conf,
        cruise_container::input_fs::webhdfs_options(&config.hdfs).with_user(user),
    ))
}

/// `<dir>/<name>` for URIs and paths.
fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// The staging root: `yarn.staging_dir`, or `/user/<user>/.cruise-staging`
/// on the default file system (which must not be local).
fn staging_root(config: &CruiseConfig, fs: &FileSystem, user: &str) -> anyhow::Result<String> {
    let default_fs = fs.conf().default_fs().context("reading fs.defaultFS")?;
    let dir = if config.yarn.staging_dir.is_empty() {
        format!("/user/{user}/.cruise-staging")
    } else {
        config.yarn.staging_dir.clone()
    };
    if dir.contains("://") {
        return Ok(dir);
    }
    if default_fs.starts_with("file:") {
        bail!(
            "the staging directory {dir:?} would be on the local file system (fs.defaultFS is {default_fs:?}); \
             point HADOOP_CONF_DIR at a folder whose core-site.xml sets fs.defaultFS to your HDFS, \
             or set yarn.staging_dir to an hdfs:// URI"
        );
    }
    Ok(format!("{}{}", default_fs.trim_end_matches('/'), dir))
}

async fn upload(fs: &FileSystem, uri: &str, data: Bytes) -> anyhow::Result<(u64, u64)> {
    let len = data.len() as u64;
    fs.create(uri, data, true)
        .await
        .with_context(|| format!("uploading {len} bytes to {uri}"))?;
    let st = fs
        .status(uri)
        .await
        .with_context(|| format!("reading the status of {uri}"))?;
    if st.len != len {
        bail!("{uri} has {} bytes after uploading {len}", st.len);
    }
    Ok((st.len, st.modification_time))
}

/// Uploads a local input (file or directory of files) into `dir`; returns
/// the URI to read.
async fn upload_input(fs: &FileSystem, local: &Path, dir: &str) -> anyhow::Result<String> {
    let meta = std::fs::metadata(local).with_context(|| format!("input {}", local.display()))?;
    let files: Vec<PathBuf> = if meta.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(local)
            .with_context(|| format!("listing input {}", local.display()))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter(|e| !is_hidden(&e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .collect();
        v.sort();
        v
    } else {
        vec![local.to_path_buf()]
    };
    fs.mkdirs(dir)
        .await
        .with_context(|| format!("creating {dir}"))?;
    for f in &files {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "input".into());
        let data = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        upload(fs, &join(dir, &name), Bytes::from(data)).await?;
    }
    Ok(if meta.is_dir() || files.len() != 1 {
        dir.to_string()
    } else {
        join(
            dir,
            &files[0]
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        )
    })
}

/// The tarball: this `cruise` binary and the client's Hadoop configuration.
fn build_tarball() -> anyhow::Result<Vec<u8>> {
    let exe = std::env::current_exe().context("locating the cruise executable")?;
    let bin = std::fs::read(&exe).with_context(|| format!("reading {}", exe.display()))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut conf_files: Vec<(String, Vec<u8>)> = Vec::new();
    if let Some(dir) = std::env::var_os("HADOOP_CONF_DIR").filter(|d| !d.is_empty()) {
        for name in ["core-site.xml", "hdfs-site.xml", "yarn-site.xml"] {
            let p = Path::new(&dir).join(name);
            if p.is_file() {
                let data = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
                conf_files.push((format!("{HADOOP_CONF_IN_TARBALL}/{name}"), data));
            }
        }
    }
    let mut entries = vec![tarball::Entry {
        path: "cruise",
        mode: 0o755,
        mtime: now,
        data: &bin,
    }];
    for (p, d) in &conf_files {
        entries.push(tarball::Entry {
            path: p,
            mode: 0o644,
            mtime: now,
            data: d,
        });
    }
    Ok(tarball::build(&entries)?)
}

/// `cruise submit`: stages the job and submits its AM. `work` is where a
/// generated input is written before it is uploaded.
pub async fn submit(mut config: CruiseConfig, work: &Path) -> anyhow::Result<Submitted> {
    let s = yarn_settings(&config)?;
    let (rm, _) = clients(&config, &s)?;
    let fs = file_system(&config, &s.user)?;
    let app = rm.new_application().await?;
    let id = app.application_id.clone();
    check_fits(&config, &app.maximum_resource_capability)?;

    let staging = join(&staging_root(&config, &fs, &s.user)?, &id);
    fs.mkdirs(&staging)
        .await
        .with_context(|| format!("creating the staging directory {staging}"))?;

    let input = match Location::parse(&config.job.input) {
        _ if config.job.input.is_empty() => {
            let local = datagen::prepare_input(&config, work)?;
            upload_input(&fs, Path::new(&local), &join(&staging, "input")).await?
        }
        Ok(Location::Local { path }) => upload_input(&fs, &path, &join(&staging, "input")).await?,
        Ok(Location::Remote { .. }) => config.job.input.clone(),
        Err(e) => bail!("--input {:?}: {e}", config.job.input),
    };

    let tar = build_tarball()?;
    let tar_uri = join(&staging, TARBALL);
    let (tar_len, tar_mtime) = upload(&fs, &tar_uri, Bytes::from(tar)).await?;

    config.runtime.kind = RuntimeKind::Yarn;
    config.job.input = input.clone();
    place_checkpoints(&mut config, &staging);
    config.job.work_dir = String::new();
    config.yarn.evaluator_artifact = tar_uri.clone();
    config.yarn.rm_addresses = s.rm_addresses.clone();
    config.yarn.user = s.user.clone();
    config.yarn.min_allocation_mb = s.min_allocation_mb;
    let toml_text = toml::to_string_pretty(&config).context("writing the job configuration")?;
    let job_uri = join(&staging, JOB_TOML);
    let (job_len, job_mtime) = upload(&fs, &job_uri, Bytes::from(toml_text)).await?;

    let mut env = am_environment(&s.user);
    let mut local_resources = vec![
        LocalResource {
            key: ARTIFACT_DIR.into(),
            url: tar_uri,
            kind: ResourceType::Archive,
            size: tar_len,
            timestamp: tar_mtime,
        },
        LocalResource {
            key: JOB_TOML.into(),
            url: job_uri,
            kind: ResourceType::File,
            size: job_len,
            timestamp: job_mtime,
        },
    ];
    let am = format!("./{ARTIFACT_DIR}/cruise appmaster --config {JOB_TOML}");
    let command = if config.yarn.am_register_jar.is_empty() {
        am
    } else {
        let jar = Path::new(&config.yarn.am_register_jar);
        let data = std::fs::read(jar)
            .with_context(|| format!("yarn.am_register_jar: reading {}", jar.display()))?;
        let jar_uri = join(&staging, AM_REGISTER_JAR);
        let (jar_len, jar_mtime) = upload(&fs, &jar_uri, Bytes::from(data)).await?;
        local_resources.push(LocalResource {
            key: AM_REGISTER_JAR.into(),
            url: jar_uri,
            kind: ResourceType::File,
            size: jar_len,
            timestamp: jar_mtime,
        });
        env.insert("CLASSPATH".to_string(), am_classpath()?);
        format!("{{{{JAVA_HOME}}}}/bin/java -Xmx128m cruise.hadoop.AmRegistrar {am}")
    };
    let submission = Submission {
        application_id: id.clone(),
        name: config.job.name.clone(),
        queue: config.yarn.queue.clone(),
        application_type: "CRUISE".into(),
        max_attempts: config.yarn.max_app_attempts,
        memory_mb: config.yarn.am_memory_mb,
        vcores: config.yarn.am_cores,
        local_resources,
        environment: env,
        command: format!("{command} 1><LOG_DIR>/stdout 2><LOG_DIR>/stderr"),
    };
    rm.submit(&submission).await?;
    Ok(Submitted {
        service: service_name_for_app(&config.yarn.service_name_prefix, &id).unwrap_or_default(),
        application_id: id,
        staging_dir: staging,
        input,
        rm: rm.base(),
    })
}

/// Where a submitted job's checkpoints go, and whether they are deleted
/// once it has finished successfully. Without `checkpoint.dir`, in the
/// application's staging directory `staging`, where every evaluator and
/// every attempt of the AM reach them (a later attempt resumes from the
/// newest). `checkpoint.delete_on_success = auto` becomes `always` for
/// those, and `never` for a `checkpoint.dir` of the user's.
fn place_checkpoints(config: &mut CruiseConfig, staging: &str) {
    let placed = config.checkpoint.enabled && config.checkpoint.dir.is_empty();
    if placed {
        config.checkpoint.dir = join(staging, CHECKPOINT_DIR);
    }
    if config.checkpoint.delete_on_success == DeleteCheckpoints::Auto {
        config.checkpoint.delete_on_success = if placed {
            DeleteCheckpoints::Always
        } else {
            DeleteCheckpoints::Never
        };
    }
}

/// Hadoop's default `yarn.application.classpath`.
const DEFAULT_APPLICATION_CLASSPATH: &[&str] = &[
    "{{HADOOP_CONF_DIR}}",
    "{{HADOOP_COMMON_HOME}}/share/hadoop/common/*",
    "{{HADOOP_COMMON_HOME}}/share/hadoop/common/lib/*",
    "{{HADOOP_HDFS_HOME}}/share/hadoop/hdfs/*",
    "{{HADOOP_HDFS_HOME}}/share/hadoop/hdfs/lib/*",
    "{{HADOOP_YARN_HOME}}/share/hadoop/yarn/*",
    "{{HADOOP_YARN_HOME}}/share/hadoop/yarn/lib/*",
];

/// The AM container's `CLASSPATH` when it runs under the registrar: the
/// registrar's jar, then `yarn.application.classpath` from the client's
/// yarn-site.xml (else Hadoop's default), joined with `<CPS>`.
fn am_classpath() -> anyhow::Result<String> {
    let conf = hadoop_conf()?;
    let configured = conf
        .get("yarn.application.classpath")
        .context("reading yarn.application.classpath")?;
    let mut entries = vec![format!("{{{{PWD}}}}/{AM_REGISTER_JAR}")];
    match configured.filter(|c| !c.trim().is_empty()) {
        Some(c) => entries.extend(
            c.split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(String::from),
        ),
        None => entries.extend(DEFAULT_APPLICATION_CLASSPATH.iter().map(|e| e.to_string())),
    }
    Ok(entries.join("<CPS>"))
}

/// Refuses containers larger than the largest the cluster grants (`max`):
/// the AM's and the evaluators'.
fn check_fits(config: &CruiseConfig, max: &Resource) -> anyhow::Result<()> {
    let too_big = |what: &str, mb: u32, cores: u32| -> anyhow::Result<()> {
        if (max.memory > 0 && i64::from(mb) > max.memory)
            || (max.vcores > 0 && i64::from(cores) > max.vcores)
        {
            bail!(
                "{what} ({mb} MB, {cores} cores) is larger than the largest container the cluster grants ({} MB, {} vcores)",
                max.memory,
                max.vcores
            );
        }
        Ok(())
    };
    too_big(
        "the AM container (yarn.am_memory_mb, yarn.am_cores)",
        config.yarn.am_memory_mb,
        config.yarn.am_cores,
    )?;
    too_big(
        "an evaluator container (runtime.container_memory_mb, runtime.container_cores)",
        config.runtime.container_memory_mb,
        config.runtime.container_cores,
    )
}

/// The AM container's environment: the Hadoop configuration shipped in the
/// tarball, the user, and the log filters (`CRUISE_AM_LOG`, default
/// `info`; `CRUISE_EVALUATOR_LOG` passed on if set).
fn am_environment(user: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert(
        "HADOOP_CONF_DIR".to_string(),
        format!("{{{{PWD}}}}/{ARTIFACT_DIR}/{HADOOP_CONF_IN_TARBALL}"),
    );
    env.insert("HADOOP_USER_NAME".to_string(), user.to_string());
    env.insert(
        "RUST_LOG".to_string(),
        std::env::var("CRUISE_AM_LOG").unwrap_or_else(|_| "info".to_string()),
    );
    if let Ok(v) = std::env::var("CRUISE_EVALUATOR_LOG") {
        env.insert("CRUISE_EVALUATOR_LOG".to_string(), v);
    }
    env
}

/// `cruise status`: the application report and its evaluator service.
#[derive(Debug, Clone, Serialize)]
pub struct StatusReport {
    /// The application.
    pub app: AppReport,
    /// Its evaluator service, if it exists.
    pub service: Option<ServiceReport>,
    /// The service's name.
    pub service_name: String,
    /// What the AM wrote at the job's end (`summary.json`: the job's
    /// summary, or its error), once the application has ended, if the AM
    /// got that far and its log is there.
    pub result: Option<serde_json::Value>,
    /// The job's web UI, while it runs (as its AM printed it).
    pub ui: Option<String>,
}

/// Reads an application's report and its service.
pub async fn status(config: &CruiseConfig, app_id: &str) -> anyhow::Result<StatusReport> {
    let s = yarn_settings(config)?;
    let (rm, svc) = clients(config, &s)?;
    let app = rm.app(app_id).await?;
    let service_name =
        service_name_for_app(&config.yarn.service_name_prefix, app_id).unwrap_or_default();
    let service = if service_name.is_empty() {
        None
    } else {
        svc.get(&service_name).await?
    };
    // The job's result: what its AM wrote when it ended. A cluster that no
    // longer serves the log leaves the report without it.
    let result = if app.is_final() {
        match am_files(&rm, app_id, &[SUMMARY_FILE.to_string()], None).await {
            Ok(files) => files
                .into_iter()
                .find_map(|(_, text)| serde_json::from_str(&text?).ok()),
            Err(e) => {
                tracing::debug!("no summary of {app_id}: {e:#}");
                None
            }
        }
    } else {
        None
    };
    // Where the running job's web UI is: the AM prints it at start.
    let ui = if app.state == "RUNNING" {
        am_files(&rm, app_id, &["stderr".to_string()], None)
            .await
            .ok()
            .into_iter()
            .flatten()
            .filter_map(|(_, text)| text)
            .find_map(|t| ui_address(&t))
    } else {
        None
    };
    Ok(StatusReport {
        app,
        service,
        service_name,
        result,
        ui,
    })
}

/// The web UI's address in an AM's output (`cruise: web UI at URL, ...`).
fn ui_address(output: &str) -> Option<String> {
    output.lines().find_map(|l| {
        let rest = l.split("web UI at ").nth(1)?;
        Some(rest.split([',', ' ']).next()?.to_string())
    })
}

/// The job's result in `summary.json` for people: how it ended, its final
/// figures and its configurations.
fn result_text(out: &mut String, v: &serde_json::Value) {
    use std::fmt::Write;
    if let Some(e) = v["error"].as_str() {
        let _ = writeln!(out, "job          failed: {e}");
        if let Some(dir) = v["checkpoint_dir"].as_str() {
            let _ = writeln!(out, "checkpoints  kept in {dir}");
        }
        return;
    }
    let s = &v["summary"];
    let Some(epochs) = s["epochs"].as_array() else {
        return;
    };
    let loss_name = s["loss_name"].as_str().unwrap_or("loss");
    let stats = &s["final_stats"];
    let records = stats["records"].as_f64().unwrap_or(0.0);
    let terms = stats["loss_terms"]
        .as_f64()
        .filter(|t| *t > 0.0)
        .unwrap_or(records);
    let _ = writeln!(
        out,
        "job          {} finished: {} epochs of {} records, {:.2} s",
        s["job_id"].as_str().unwrap_or(""),
        epochs.len(),
        s["records"],
        s["wall_secs"].as_f64().unwrap_or(0.0)
    );
    if terms > 0.0 {
        let _ = writeln!(
            out,
            "final        {loss_name} {:.4} (the final model evaluated over all input){}",
            stats["loss_sum"].as_f64().unwrap_or(f64::NAN) / terms,
            if s["has_accuracy"].as_bool() == Some(true) && records > 0.0 {
                format!(
                    ", accuracy {:.2}%",
                    100.0 * stats["correct"].as_f64().unwrap_or(0.0) / records
                )
            } else {
                String::new()
            }
        );
    }
    let split = |w: &serde_json::Value, s: &serde_json::Value| {
        crate::am::split_text(
            w.as_u64().unwrap_or(0) as u32,
            s.as_u64().unwrap_or(0) as u32,
        )
    };
    let _ = writeln!(
        out,
        "configuration started with {} containers: {}{}",
        s["containers"],
        split(&s["workers"], &s["servers"]),
        epochs
            .last()
            .map(|e| format!("; ended with {}", split(&e["workers"], &e["servers"])))
            .unwrap_or_default()
    );
    if let Some(dir) = s["checkpoint_dir"].as_str() {
        let fate = if s["checkpoints_deleted"].as_bool() == Some(true) {
            "deleted from"
        } else {
            "kept in"
        };
        let _ = writeln!(
            out,
            "checkpoints  {} published, {fate} {dir}",
            s["checkpoints"]
        );
    }
    for r in s["reconfigurations"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "reconfigured at {:.1} s: {}",
            r["at_secs"].as_f64().unwrap_or(0.0),
            r["summary"].as_str().unwrap_or("")
        );
    }
}

/// A status report for people.
pub fn status_text(r: &StatusReport) -> String {
    use std::fmt::Write;
    let a = &r.app;
    let mut out = String::new();
    let _ = writeln!(out, "application  {} ({})", a.id, a.name);
    let _ = writeln!(
        out,
        "state        {} (final status {}), progress {:.0}%",
        a.state, a.final_status, a.progress
    );
    let _ = writeln!(out, "user/queue   {} / {}", a.user, a.queue);
    let _ = writeln!(out, "elapsed      {:.1} s", a.elapsed_time as f64 / 1000.0);
    if !a.tracking_url.is_empty() {
        let _ = writeln!(out, "tracking     {}", a.tracking_url);
    }
    match &r.service {
        Some(svc) => {
            let ready: usize = svc
                .components
                .iter()
                .map(|c| c.containers.iter().filter(|x| x.state == "READY").count())
                .sum();
            let _ = writeln!(
                out,
                "evaluators   service {} {}, {ready} containers ready",
                svc.name, svc.state
            );
        }
        // The AM destroys its service when the job ends, and creates it
        // once it runs.
        None if a.is_final() => {
            let _ = writeln!(
                out,
                "evaluators   service {} removed when the job ended",
                r.service_name
            );
        }
        None => {
            let _ = writeln!(
                out,
                "evaluators   service {} not created yet",
                r.service_name
            );
        }
    }
    if !a.diagnostics.trim().is_empty() {
        let _ = writeln!(out, "diagnostics  {}", a.diagnostics.trim());
    }
    if let Some(u) = &r.ui {
        let _ = writeln!(out, "web UI       {u} (metrics at {u}metrics)");
    }
    if let Some(v) = &r.result {
        result_text(&mut out, v);
    }
    out
}

/// What `cruise kill` did.
#[derive(Debug, Clone, Serialize)]
pub struct Killed {
    /// The application's state afterwards.
    pub state: String,
    /// The service.
    pub service: String,
    /// Whether the service existed (and was destroyed).
    pub service_destroyed: bool,
}

/// Kills an application and destroys its evaluator service.
pub async fn kill(config: &CruiseConfig, app_id: &str) -> anyhow::Result<Killed> {
    let s = yarn_settings(config)?;
    let (rm, svc) = clients(config, &s)?;
    let state = rm.kill(app_id, Duration::from_secs(60)).await?;
    let service =
        service_name_for_app(&config.yarn.service_name_prefix, app_id).unwrap_or_default();
    let service_destroyed = if service.is_empty() {
        false
    } else {
        svc.destroy(&service).await?
    };
    Ok(Killed {
        state,
        service,
        service_destroyed,
    })
}

/// The AM container's log files `files` of an attempt (the last one by
/// default): `(name, text)`, `None` for a missing file, and the
/// application's state when it was killed (its output ends there).
pub async fn logs(
    config: &CruiseConfig,
    app_id: &str,
    files: &[String],
    attempt: Option<i64>,
) -> anyhow::Result<(Vec<(String, Option<String>)>, Option<String>)> {
    let s = yarn_settings(config)?;
    let (rm, _) = clients(config, &s)?;
    let out = am_files(&rm, app_id, files, attempt).await?;
    let app = rm.app(app_id).await?;
    let killed = (app.state == "KILLED" || app.final_status == "KILLED")
        .then(|| format!("{} (final status {})", app.state, app.final_status));
    Ok((out, killed))
}

/// The AM container's log files `files` of an attempt (the last one by
/// default).
async fn am_files(
    rm: &RmClient,
    app_id: &str,
    files: &[String],
    attempt: Option<i64>,
) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let attempts = rm.attempts(app_id).await?;
    let a = match attempt {
        Some(n) => attempts
            .iter()
            .find(|a| a.id == n)
            .with_context(|| format!("{app_id} has no attempt {n}"))?,
        None => attempts
            .iter()
            .max_by_key(|a| a.id)
            .with_context(|| format!("{app_id} has no AM attempt yet"))?,
    };
    if a.container_id.is_empty() || a.node_http_address.is_empty() {
        bail!(
            "attempt {} of {app_id} has no AM container yet (state {})",
            a.id,
            a.app_attempt_state
        );
    }
    let mut out = Vec::new();
    for f in files {
        let text = rm
            .container_log(&a.node_http_address, &a.container_id, f)
            .await?;
        out.push((format!("{}/{f}", a.container_id), text));
    }
    Ok(out)
}

/// The first directory of the comma-separated list in the NodeManager's
/// environment variable `var` (`LOG_DIRS`, `LOCAL_DIRS`), if any.
fn first_nm_dir(var: &str) -> Option<PathBuf> {
    std::env::var(var)
        .ok()
        .and_then(|d| d.split(',').next().map(PathBuf::from))
        .filter(|p| !p.as_os_str().is_empty())
}

/// Where the AM writes files `cruise logs` can fetch: the first of
/// `$LOG_DIRS`, else the working directory.
pub fn am_log_dir() -> PathBuf {
    first_nm_dir("LOG_DIRS").unwrap_or_else(|| PathBuf::from("."))
}

/// The job a YARN application runs, in every attempt:
/// `application_<ts>_<seq>` → `job_<ts>_<seq>`.
pub fn job_of_application(application_id: &str) -> Option<String> {
    let (ts, seq) = parse_application_id(application_id)?;
    Some(format!("job_{ts}_{seq:04}"))
}

/// Settings of `cruise appmaster`, worked out from its container.
pub struct AppmasterSetup {
    /// The configuration (with `runtime.am_bind` made reachable).
    pub config: CruiseConfig,
    /// The application.
    pub application_id: String,
    /// Which attempt of the application this AM is (1 for the first),
    /// from its container id.
    pub attempt: u32,
    /// The job every attempt runs: named after the application.
    pub job_id: String,
    /// The evaluator service.
    pub service: String,
    /// Work directory: in the application's local directory
    /// (`$LOCAL_DIRS`), which YARN shares between the attempts of an
    /// application on one node and deletes when the application ends;
    /// else `work` in the container's working directory.
    pub work: PathBuf,
    /// The resource manager factory.
    pub factory: crate::am::RmFactory,
}

/// `addr` (the value of `key`) on this YARN node's address (`NM_HOST`)
/// when it binds loopback or every address; `None` to keep it.
async fn on_node(addr: &str, key: &str) -> anyhow::Result<Option<String>> {
    let bind: std::net::SocketAddr = addr.parse().with_context(|| format!("{key} {addr:?}"))?;
    if !(bind.ip().is_loopback() || bind.ip().is_unspecified()) {
        return Ok(None);
    }
    let Some(host) = std::env::var("NM_HOST").ok().filter(|h| !h.is_empty()) else {
        return Ok(None);
    };
    let ip = tokio::net::lookup_host((host.as_str(), bind.port()))
        .await
        .with_context(|| format!("resolving the node's host name NM_HOST={host}"))?
        .find(|a| a.is_ipv4())
        .with_context(|| format!("NM_HOST={host} has no IPv4 address"))?;
    Ok(Some(ip.to_string()))
}

/// Prepares the AM inside its YARN container: loads `config_file`, finds its
/// application and attempt from `$CONTAINER_ID`, binds the control port to
/// the node's address, and builds the YARN runtime for the evaluator
/// service.
pub async fn appmaster_setup(config_file: &Path) -> anyhow::Result<AppmasterSetup> {
    let mut config = Layers::from_process_env(Some(config_file.to_path_buf())).load()?;
    let cid = std::env::var("CONTAINER_ID")
        .context("CONTAINER_ID is not set: `cruise appmaster` runs inside a YARN AM container (use `cruise submit`)")?;
    let not_yarn = || format!("CONTAINER_ID {cid:?} is not a YARN container id");
    let application_id = application_of_container(&cid).with_context(not_yarn)?;
    let attempt = attempt_of_container(&cid).with_context(not_yarn)?;
    let job_id = job_of_application(&application_id).with_context(not_yarn)?;
    if config.runtime.kind != RuntimeKind::Yarn {
        bail!(
            "{}: runtime.kind is {:?}; the AM in a YARN container runs the yarn runtime",
            config_file.display(),
            config.runtime.kind.as_str()
        );
    }
    if config.job.input.is_empty() {
        bail!("{}: job.input is empty", config_file.display());
    }
    // Evaluators reach the control port, and people the web UI, from other
    // hosts: both bind the node's address rather than loopback.
    if let Some(a) = on_node(&config.runtime.am_bind, "runtime.am_bind").await? {
        config.runtime.am_bind = a;
    }
    if !config.status.bind.is_empty()
        && let Some(a) = on_node(&config.status.bind, "status.bind").await?
    {
        config.status.bind = a;
    }
    let service = service_name_for_app(&config.yarn.service_name_prefix, &application_id)
        .with_context(|| format!("naming the service of {application_id}"))?;
    let settings = yarn_settings(&config)?;
    let ship = !config.yarn.evaluator_artifact.is_empty()
        && Path::new(ARTIFACT_DIR)
            .join(HADOOP_CONF_IN_TARBALL)
            .is_dir();
    let factory = yarn_factory(
        &config,
        settings,
        YarnPlacement {
            service_name: Some(service.clone()),
            ship_hadoop_conf: ship,
            application: Some(application_id.clone()),
        },
    );
    let work = match first_nm_dir("LOCAL_DIRS") {
        Some(app_dir) => app_dir.join(AM_WORK_DIR),
        None => std::env::current_dir()
            .context("reading the working directory")?
            .join("work"),
    };
    Ok(AppmasterSetup {
        config,
        application_id,
        attempt,
        job_id,
        service,
        work,
        factory,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_web_ui_is_found_in_the_ams_output() {
        let out = "cruise: job job_1 on 4 yarn containers, status at http://10.0.0.5:4000/status\n\
                   cruise: web UI at http://10.0.0.5:4000/, Prometheus metrics at http://10.0.0.5:4000/metrics\n";
        assert_eq!(
            super::ui_address(out).as_deref(),
            Some("http://10.0.0.5:4000/")
        );
        assert_eq!(super::ui_address("cruise: loading\n"), None);
    }

    use super::*;

    #[test]
    fn every_attempt_runs_the_job_named_after_the_application() {
        assert_eq!(
            job_of_application("application_1700000000000_0007").as_deref(),
            Some("job_1700000000000_0007")
        );
        assert_eq!(job_of_application("job_1"), None);
    }

    #[test]
    fn checkpoints_placed_in_staging_are_deleted_after_success_and_the_users_are_kept() {
        let staging = "hdfs://nn:8020/user/alice/.cruise-staging/application_1_0001";
        let placed = |dir: &str, delete: DeleteCheckpoints| {
            let mut c = CruiseConfig::default();
            c.checkpoint.dir = dir.to_string();
            c.checkpoint.delete_on_success = delete;
            place_checkpoints(&mut c, staging);
            (c.checkpoint.dir, c.checkpoint.delete_on_success)
        };
        assert_eq!(
            placed("", DeleteCheckpoints::Auto),
            (format!("{staging}/checkpoints"), DeleteCheckpoints::Always)
        );
        assert_eq!(
            placed("", DeleteCheckpoints::Never),
            (format!("{staging}/checkpoints"), DeleteCheckpoints::Never)
        );
        let mine = "hdfs://nn:8020/user/alice/ckpts";
        assert_eq!(
            placed(mine, DeleteCheckpoints::Auto),
            (mine.to_string(), DeleteCheckpoints::Never)
        );
        assert_eq!(
            placed(mine, DeleteCheckpoints::Always),
            (mine.to_string(), DeleteCheckpoints::Always)
        );
        let mut off = CruiseConfig::default();
        off.checkpoint.enabled = false;
        place_checkpoints(&mut off, staging);
        assert_eq!(off.checkpoint.dir, "");
        assert_eq!(off.checkpoint.delete_on_success, DeleteCheckpoints::Never);
    }

    #[test]
    fn joins() {
        assert_eq!(join("hdfs://nn:1/a/", "b"), "hdfs://nn:1/a/b");
        assert_eq!(join("/a", "b"), "/a/b");
    }
}
