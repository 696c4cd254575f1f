//! Choosing and building the resource manager a configuration asks for
//! (`runtime.kind`): the local runtime (optionally on an emulated cluster,
//! `[emulation]`), YARN (evaluators in a YARN service) or Mesos (evaluators
//! as tasks of a framework), plus the cluster settings they need: RM addresses from `[yarn]` or `$HADOOP_CONF_DIR/yarn-site.xml`,
//! the user, retry and timeout settings.

use std::sync::Arc;
use std::time::Duration;

use cruise_conf::{CruiseConfig, EmulationMechanism, RuntimeKind};
use cruise_container::emulate;
use cruise_container::evaluator::ENV_JOB_ID;
use cruise_hdfs::{HadoopConf, WebHdfsOptions};
use cruise_rm::ResourceManager;
use cruise_rm::emulation::{Choice, Emulation, EmulationSpec, ProcessEnv, Shape};
use cruise_rm::http::{HttpOptions, RetryPolicy};
use cruise_rm::local::{LocalConfig, LocalRm};
use cruise_rm::mesos::{MesosConfig, MesosRm};
use cruise_rm::yarn::orphan::ServiceOwner;
use cruise_rm::yarn::rm::parse_application_id;
use cruise_rm::yarn::{ARTIFACT_DIR, YarnConfig, YarnRm};

use crate::am::{AmError, RmFactory};

/// The component of the evaluator service.
pub const EVALUATOR_COMPONENT: &str = "evaluator";
/// Folder of the Hadoop client configuration inside the submitted tarball.
pub const HADOOP_CONF_IN_TARBALL: &str = "hadoop-conf";

/// Where the YARN cluster is and who talks to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YarnSettings {
    /// RM web addresses.
    pub rm_addresses: Vec<String>,
    /// User name for REST and HDFS.
    pub user: String,
    /// `yarn.scheduler.minimum-allocation-mb`.
    pub min_allocation_mb: u32,
}

/// The OS user: `$USER`, `$LOGNAME`, else the password database.
pub fn os_user() -> String {
    for var in ["USER", "LOGNAME"] {
        if let Ok(u) = std::env::var(var)
            && !u.is_empty()
        {
            return u;
        }
    }
    match nix::unistd::User::from_uid(nix::unistd::getuid()) {
        Ok(Some(u)) => u.name,
        _ => "nobody".to_string(),
    }
}

/// Passes this process's Hadoop client environment (`HADOOP_CONF_DIR`,
/// `HADOOP_USER_NAME`) on to evaluators that do not get one otherwise, so
/// that they resolve `hdfs://` input as the AM does. On a cluster the same
/// path must hold the configuration on every node.
fn forward_hadoop_env(env: &mut std::collections::BTreeMap<String, String>) {
    for var in ["HADOOP_CONF_DIR", "HADOOP_USER_NAME"] {
        if let Ok(v) = std::env::var(var)
            && !v.is_empty()
        {
            env.entry(var.to_string()).or_insert(v);
        }
    }
}

/// The Hadoop client configuration: `core-site.xml`, `hdfs-site.xml` and
/// `yarn-site.xml` from `$HADOOP_CONF_DIR` (empty when it is not set).
pub fn hadoop_conf() -> Result<HadoopConf, AmError> {
    let mut conf = HadoopConf::from_env().map_err(|e| AmError::Config(e.to_string()))?;
    if let Some(dir) = std::env::var_os("HADOOP_CONF_DIR").filter(|d| !d.is_empty()) {
        let yarn_site = std::path::Path::new(&dir).join("yarn-site.xml");
        if yarn_site.is_file() {
            conf.load_file(&yarn_site)
                .map_err(|e| AmError::Config(e.to_string()))?;
        }
    }
    Ok(conf)
}

/// RM web addresses from a Hadoop configuration (`PROTOCOLS.md` §6.2): the
/// per-id HA keys, else `yarn.resourcemanager.webapp.address`, else the RM
/// host name with the default port (8088, or 8090 with `HTTPS_ONLY`).
pub fn rm_addresses_from(conf: &HadoopConf) -> Result<Vec<String>, String> {
    let get = |k: &str| conf.get(k).map_err(|e| e.to_string());
    let https = get("yarn.http.policy")?.is_some_and(|p| p.eq_ignore_ascii_case("HTTPS_ONLY"));
    let (key, port, scheme) = if https {
        ("yarn.resourcemanager.webapp.https.address", 8090, "https")
    } else {
        ("yarn.resourcemanager.webapp.address", 8088, "http")
    };
    let one = |suffix: &str| -> Result<Option<String>, String> {
        if let Some(a) = get(&format!("{key}{suffix}"))? {
            return Ok(Some(a));
        }
        Ok(get(&format!("yarn.resourcemanager.hostname{suffix}"))?.map(|h| format!("{h}:{port}")))
    };
    let ha = get("yarn.resourcemanager.ha.enabled")?.is_some_and(|v| v.trim() == "true");
    let mut out = Vec::new();
    if ha {
        for id in conf
            .get_list("yarn.resourcemanager.ha.rm-ids")
            .map_err(|e| e.to_string())?
        {
            if let Some(a) = one(&format!(".{id}"))? {
                out.push(a);
            }
        }
    }
    if out.is_empty()
        && let Some(a) = one("")?
    {
        out.push(a);
    }
    if out.is_empty() {
        return Err(format!(
            "no ResourceManager address: set yarn.rm_addresses, or point HADOOP_CONF_DIR at a folder whose yarn-site.xml sets {key}"
        ));
    }
    Ok(out
        .into_iter()
        .map(|a| {
            if a.contains("://") {
                a
            } else {
                format!("{scheme}://{a}")
            }
        })
        .collect())
}

/// The YARN settings of a configuration, falling back to `$HADOOP_CONF_DIR`.
pub fn yarn_settings(config: &CruiseConfig) -> Result<YarnSettings, AmError> {
    let conf = hadoop_conf()?;
    let rm_addresses = if config.yarn.rm_addresses.is_empty() {
        rm_addresses_from(&conf).map_err(AmError::Config)?
    } else {
        config.yarn.rm_addresses.clone()
    };
    let user = if config.yarn.user.is_empty() {
        WebHdfsOptions::from_env().user.unwrap_or_else(os_user)
    } else {
        config.yarn.user.clone()
    };
    let min_allocation_mb = if config.yarn.min_allocation_mb > 0 {
        config.yarn.min_allocation_mb
    } else {
        conf.get("yarn.scheduler.minimum-allocation-mb")
            .ok()
            .flatten()
            .and_then(|v| v.trim().parse().ok())
            .filter(|v| *v > 0)
            .unwrap_or(1024)
    };
    Ok(YarnSettings {
        rm_addresses,
        user,
        min_allocation_mb,
    })
}

/// Retry and timeout settings of REST clients.
pub fn http_options(config: &CruiseConfig) -> HttpOptions {
    let rt = &config.runtime;
    HttpOptions {
        retry: RetryPolicy {
            attempts: rt.rm_retries.max(1),
            initial_backoff: Duration::from_millis(rt.rm_retry_backoff_ms),
            max_backoff: Duration::from_secs(5).max(Duration::from_millis(rt.rm_retry_backoff_ms)),
        },
        connect_timeout: Duration::from_millis(rt.rm_request_timeout_ms.min(10_000)),
        request_timeout: Duration::from_millis(rt.rm_request_timeout_ms),
        max_body_bytes: rt.rm_max_response_bytes,
    }
}

/// The evaluator service of YARN application `app_id`:
/// `<prefix>-<cluster timestamp>-<sequence>`.
pub fn service_name_for_app(prefix: &str, app_id: &str) -> Option<String> {
    let (ts, seq) = parse_application_id(app_id)?;
    Some(format!("{prefix}-{ts}-{seq:04}"))
}

/// The evaluator service of a job run in the foreground (`cruise run
/// --runtime yarn`): `<prefix>-<job id digits>`.
pub fn service_name_for_job(prefix: &str, job_id: &str) -> String {
    let tail: String = job_id
        .trim_start_matches("job_")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let mut name = format!("{prefix}-{tail}");
    name.truncate(63);
    name.trim_end_matches('-').to_string()
}

/// How the YARN runtime names its service and ships its files.
#[derive(Debug, Clone)]
pub struct YarnPlacement {
    /// The service name; `None`: derived from the job id.
    pub service_name: Option<String>,
    /// Evaluators get `HADOOP_CONF_DIR` pointing into the unpacked tarball
    /// (set by `cruise appmaster` when the tarball carries it).
    pub ship_hadoop_conf: bool,
    /// The YARN application whose AM this is (`cruise appmaster`), named
    /// to the evaluators with the service and the RM so that, should the
    /// application end without the AM destroying the service, they stop
    /// it (`cruise_rm::yarn::orphan`). `None`: the AM runs outside YARN.
    pub application: Option<String>,
}

/// The emulated cluster `[emulation]` asks for, prepared (under the kernel
/// mechanism its bridge exists when this returns); `None` without emulation.
pub fn prepare_emulation(config: &CruiseConfig) -> Result<Option<Emulation>, AmError> {
    let e = &config.emulation;
    if !e.enabled() {
        return Ok(None);
    }
    let conf = |err: cruise_conf::ConfError| AmError::Config(err.to_string());
    let shapes: Vec<Shape> = e
        .parsed()
        .map_err(conf)?
        .into_iter()
        .map(|c| Shape {
            cpu: c.cpu,
            bits_per_sec: c.bits_per_sec,
        })
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let at_once = config.runtime.capacity_ceiling(&config.job) as usize;
    let cpu: f64 = (1..=at_once as u64)
        .map(|k| shapes[(k as usize - 1) % shapes.len()].cpu.unwrap_or(cores))
        .sum();
    if cpu > cores {
        tracing::warn!(
            "the CPU shares of the {at_once} emulated containers sum to {cpu:.2} cores, more than this machine's {cores}: they will contend and the emulation will not hold"
        );
    }
    let spec = EmulationSpec {
        shapes,
        choice: match e.mechanism {
            EmulationMechanism::Auto => Choice::Auto,
            EmulationMechanism::Kernel => Choice::Kernel,
            EmulationMechanism::Process => Choice::Process,
        },
        subnet: e.subnet_prefix().map_err(conf)?,
        cpu_period: Duration::from_micros(e.cpu_period_us),
        env: ProcessEnv {
            cpu: emulate::ENV_CPU.into(),
            bytes_per_sec: emulate::ENV_BANDWIDTH.into(),
        },
    };
    Ok(Some(Emulation::prepare(spec)?))
}

/// The local runtime. With `[emulation]` the emulated cluster is prepared
/// now, and under the kernel mechanism `runtime.am_bind` is moved to the
/// bridge's address (its port kept) so that evaluators in their namespaces
/// reach the AM.
pub fn local_factory(config: &mut CruiseConfig) -> Result<RmFactory, AmError> {
    let emulation = prepare_emulation(config)?;
    if let Some(ip) = emulation.as_ref().and_then(Emulation::am_ip) {
        let port = config
            .runtime
            .am_bind
            .parse::<std::net::SocketAddr>()
            .map_or(0, |a| a.port());
        config.runtime.am_bind = std::net::SocketAddr::new(ip.into(), port).to_string();
    }
    let rt = config.runtime.clone();
    let max_containers = rt.effective_max_containers(&config.job);
    Ok(Box::new(move |launch, events| {
        let capacity_schedule = rt
            .capacity_schedule()
            .map_err(|e| AmError::Config(e.to_string()))?;
        let id_prefix = format!(
            "container_{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0)
        );
        let cfg = LocalConfig {
            max_containers,
            release_grace: Duration::from_millis(rt.release_grace_ms),
            id_prefix,
            capacity_schedule,
            reclaim_deadline: Duration::from_millis(rt.reclaim_deadline_ms),
        };
        Ok(
            Arc::new(LocalRm::start_emulated(cfg, launch, events, emulation))
                as Arc<dyn ResourceManager>,
        )
    }))
}

/// The YARN runtime.
pub fn yarn_factory(
    config: &CruiseConfig,
    settings: YarnSettings,
    place: YarnPlacement,
) -> RmFactory {
    let y = config.yarn.clone();
    let rt = config.runtime.clone();
    let http = http_options(config);
    Box::new(move |mut launch, events| {
        let job_id = launch.env.get(ENV_JOB_ID).cloned().unwrap_or_default();
        let service_name = place
            .service_name
            .clone()
            .unwrap_or_else(|| service_name_for_job(&y.service_name_prefix, &job_id));
        let tarball = (!y.evaluator_artifact.is_empty()).then(|| y.evaluator_artifact.clone());
        if tarball.is_some() && rt.evaluator_command.is_empty() {
            launch.program = format!("./{ARTIFACT_DIR}/cruise");
        }
        if place.ship_hadoop_conf {
            launch.env.insert(
                "HADOOP_CONF_DIR".into(),
                format!("{{{{PWD}}}}/{ARTIFACT_DIR}/{HADOOP_CONF_IN_TARBALL}"),
            );
        }
        launch
            .env
            .insert("HADOOP_USER_NAME".into(), settings.user.clone());
        forward_hadoop_env(&mut launch.env);
        if let Some(application) = &place.application {
            let owner = ServiceOwner {
                application: application.clone(),
                service: service_name.clone(),
                rm_addresses: settings.rm_addresses.clone(),
                user: Some(settings.user.clone()),
            };
            launch.env.extend(owner.env());
        }
        let cfg = YarnConfig {
            rm_addresses: settings.rm_addresses.clone(),
            user: Some(settings.user.clone()),
            http: http.clone(),
            service_name,
            component: EVALUATOR_COMPONENT.into(),
            queue: y.queue.clone(),
            tarball,
            lifetime_secs: (y.service_lifetime_secs > 0).then_some(y.service_lifetime_secs),
            poll_interval: Duration::from_millis(y.poll_interval_ms),
            capacity_poll_interval: Duration::from_millis(y.capacity_poll_interval_ms),
            decommission_poll_interval: Duration::from_millis(y.decommission_poll_interval_ms),
            decommission_default_timeout: Duration::from_secs(y.decommission_default_timeout_secs),
            min_allocation_mb: settings.min_allocation_mb,
            default_size: (rt.container_memory_mb, rt.container_cores),
        };
        let rm = YarnRm::start(cfg, launch, events)?;
        tracing::info!(service = rm.service_name(), "YARN runtime ready");
        Ok(Arc::new(rm) as Arc<dyn ResourceManager>)
    })
}

/// The Mesos runtime.
pub fn mesos_factory(config: &CruiseConfig) -> RmFactory {
    let m = config.mesos.clone();
    let rt = config.runtime.clone();
    let http = http_options(config);
    Box::new(move |mut launch, events| {
        forward_hadoop_env(&mut launch.env);
        let job_id = launch
            .env
            .get(ENV_JOB_ID)
            .cloned()
            .unwrap_or_else(|| "cruise".into());
        let cfg = MesosConfig {
            masters: m.masters(),
            http,
            user: if m.user.is_empty() {
                os_user()
            } else {
                m.user.clone()
            },
            framework_name: m.framework_name.clone(),
            role: m.role.clone(),
            failover_timeout_secs: m.failover_timeout_secs,
            refuse_seconds: m.refuse_seconds,
            missed_heartbeats: m.missed_heartbeats,
            task_prefix: job_id,
            evaluator_uri: (!m.evaluator_uri.is_empty()).then(|| m.evaluator_uri.clone()),
            kill_grace: Duration::from_millis(rt.release_grace_ms),
            default_size: (rt.container_memory_mb, rt.container_cores),
        };
        Ok(Arc::new(MesosRm::start(cfg, launch, events)?) as Arc<dyn ResourceManager>)
    })
}

/// The resource manager of a job run in the foreground (`cruise run`); the
/// local runtime may move `runtime.am_bind` (see [`local_factory`]).
pub fn foreground_factory(config: &mut CruiseConfig) -> Result<RmFactory, AmError> {
    Ok(match config.runtime.kind {
        RuntimeKind::Local => local_factory(config)?,
        RuntimeKind::Mesos => mesos_factory(config),
        RuntimeKind::Yarn => yarn_factory(
            config,
            yarn_settings(config)?,
            YarnPlacement {
                service_name: None,
                ship_hadoop_conf: false,
                application: None,
            },
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            service_name_for_app("cruise", "application_1700000000000_0007").as_deref(),
            Some("cruise-1700000000000-0007")
        );
        assert_eq!(service_name_for_app("cruise", "nope"), None);
        assert_eq!(
            service_name_for_job("cruise", "job_1700000000_ab12"),
            "cruise-1700000000-ab12"
        );
    }

    #[test]
    fn rm_addresses_from_yarn_site() {
        let mut c = HadoopConf::new();
        c.load_str(
            "<configuration><property><name>yarn.resourcemanager.webapp.address</name><value>rm:18088</value></property></configuration>",
            "yarn-site.xml",
        )
        .unwrap();
        assert_eq!(rm_addresses_from(&c).unwrap(), vec!["http://rm:18088"]);

        let mut c = HadoopConf::new();
        c.load_str(
            "<configuration>\
             <property><name>yarn.resourcemanager.ha.enabled</name><value>true</value></property>\
             <property><name>yarn.resourcemanager.ha.rm-ids</name><value>rm1,rm2</value></property>\
             <property><name>yarn.resourcemanager.hostname.rm1</name><value>h1</value></property>\
             <property><name>yarn.resourcemanager.webapp.address.rm2</name><value>h2:9999</value></property>\
             </configuration>",
            "yarn-site.xml",
        )
        .unwrap();
        assert_eq!(
            rm_addresses_from(&c).unwrap(),
            vec!["http://h1:8088", "http://h2:9999"]
        );

        let err = rm_addresses_from(&HadoopConf::new()).unwrap_err();
        assert!(err.contains("yarn.rm_addresses"), "{err}");
    }
}
