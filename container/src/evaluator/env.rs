//! Who an evaluator is and where its AM is, read from the environment its
//! resource manager started it with.

use std::collections::BTreeMap;

use super::EvaluatorError;
use crate::emulate;
use crate::protocol::Secret;

/// Environment variable: the AM's control address (`host:port`).
pub const ENV_AM_ADDR: &str = "CRUISE_AM_ADDR";
/// Environment variable: the job id.
pub const ENV_JOB_ID: &str = "CRUISE_JOB_ID";
/// Environment variable: the job secret (hex).
pub const ENV_JOB_SECRET: &str = "CRUISE_JOB_SECRET";
/// Environment variable: the container id given by the local runtime.
pub const ENV_CONTAINER_ID: &str = "CRUISE_CONTAINER_ID";
/// Container id variables set by other resource managers, tried in order.
pub const CONTAINER_ID_FALLBACKS: [&str; 2] = ["CONTAINER_ID", "MESOS_TASK_ID"];

/// Who this evaluator is and where its AM is.
#[derive(Debug, Clone)]
pub struct EvaluatorEnv {
    /// The AM's control address.
    pub am_addr: String,
    /// The job id.
    pub job_id: String,
    /// The job secret.
    pub secret: Secret,
    /// The container id.
    pub container_id: String,
    /// What an emulated cluster limits this container to (`process`
    /// mechanism; unlimited otherwise).
    pub throttle: emulate::Throttle,
}

impl EvaluatorEnv {
    /// Reads the environment of this process.
    pub fn from_env() -> Result<Self, EvaluatorError> {
        Self::from_map(&std::env::vars().collect())
    }

    /// Reads the given environment.
    pub fn from_map(env: &BTreeMap<String, String>) -> Result<Self, EvaluatorError> {
        let get = |var: &'static str| {
            env.get(var)
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or(EvaluatorError::Env {
                    var,
                    reason: "not set; an evaluator is started by the AM's resource manager".into(),
                })
        };
        let secret = Secret::from_hex(&get(ENV_JOB_SECRET)?).map_err(|e| EvaluatorError::Env {
            var: ENV_JOB_SECRET,
            reason: e.to_string(),
        })?;
        let container_id = std::iter::once(ENV_CONTAINER_ID)
            .chain(CONTAINER_ID_FALLBACKS)
            .find_map(|v| env.get(v).filter(|s| !s.is_empty()).cloned())
            .ok_or(EvaluatorError::Env {
                var: ENV_CONTAINER_ID,
                reason: "not set (nor CONTAINER_ID or MESOS_TASK_ID)".into(),
            })?;
        let limit = |var: &'static str| -> Result<Option<f64>, EvaluatorError> {
            env.get(var)
                .filter(|v| !v.is_empty())
                .map(|v| {
                    v.trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite() && *x > 0.0)
                        .ok_or(EvaluatorError::Env {
                            var,
                            reason: format!("{v:?} is not a positive number"),
                        })
                })
                .transpose()
        };
        Ok(EvaluatorEnv {
            am_addr: get(ENV_AM_ADDR)?,
            job_id: get(ENV_JOB_ID)?,
            secret,
            container_id,
            throttle: emulate::Throttle {
                cpu: limit(emulate::ENV_CPU)?,
                bytes_per_sec: limit(emulate::ENV_BANDWIDTH)?,
            },
        })
    }
}
