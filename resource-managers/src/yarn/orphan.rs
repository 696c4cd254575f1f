//! An evaluator that cannot reach its AM, in the YARN service of a
//! `cruise submit` application: is the application over?
//!
//! The evaluator component's `restart_policy` is `ALWAYS` (YARN refuses to
//! flex `ON_FAILURE` and `NEVER` components), so YARN relaunches every
//! evaluator that exits for as long as the service lives. When the AM's
//! application ends without the AM destroying the service (its last
//! attempt killed with `SIGKILL`, its node lost), the relaunched
//! evaluators would look for an AM that never comes back. So an evaluator
//! that cannot reach its AM asks the RM about the application
//! ([`ServiceOwner::stop_if_ended`]): once it is `FINISHED`, `FAILED` or
//! `KILLED`, or unknown to the RM, no attempt of its AM will run again and
//! the evaluator stops the service (`PUT /app/v1/services/{name}` with
//! `{"state":"STOPPED"}`, `PROTOCOLS.md` §2.4), which ends every container
//! of it. While the application is not over (an attempt of its AM runs,
//! or the RM is about to start the next one) the service is left alone:
//! the next AM replaces it with its own.
//!
//! The AM names the application, the service and the RM in the
//! evaluators' environment ([`ServiceOwner::env`]); an evaluator of any
//! other job (the local runtime, Mesos, `cruise run --runtime yarn`) has
//! none of it and checks nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::RmError;
use crate::http::{HttpOptions, RetryPolicy};

use super::rm::{FINAL_STATES, RmClient, is_application_id};
use super::services::{ServicesClient, StopOutcome};

/// Environment variable: the YARN application whose AM runs the job.
pub const ENV_APPLICATION: &str = "CRUISE_YARN_APPLICATION";
/// Environment variable: the evaluator service's name.
pub const ENV_SERVICE: &str = "CRUISE_YARN_SERVICE";
/// Environment variable: the RM web addresses, comma-separated (HA).
pub const ENV_RM: &str = "CRUISE_YARN_RM";
/// Environment variable: the `user.name` of REST calls (may be empty).
pub const ENV_USER: &str = "CRUISE_YARN_USER";

/// The application an evaluator service belongs to, and where to ask
/// about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceOwner {
    /// The YARN application (`application_<ts>_<seq>`) whose AM runs the job.
    pub application: String,
    /// The evaluator service.
    pub service: String,
    /// RM web addresses (`host:port` or URLs; several for HA).
    pub rm_addresses: Vec<String>,
    /// `user.name` of REST calls, if any.
    pub user: Option<String>,
}

/// What [`ServiceOwner::stop_if_ended`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The application is not over: an attempt of its AM runs or is about
    /// to. The service was left alone.
    Live {
        /// Its state (`ACCEPTED`, `RUNNING`, ...).
        state: String,
    },
    /// The application is over (or unknown to the RM): the service was
    /// stopped, or already was, or is gone.
    Ended {
        /// Its state and final status, or that the RM does not know it.
        state: String,
        /// What the stop did.
        stop: StopOutcome,
    },
}

impl ServiceOwner {
    /// The variables that name this owner to the evaluators.
    pub fn env(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (ENV_APPLICATION.to_string(), self.application.clone()),
            (ENV_SERVICE.to_string(), self.service.clone()),
            (ENV_RM.to_string(), self.rm_addresses.join(",")),
            (ENV_USER.to_string(), self.user.clone().unwrap_or_default()),
        ])
    }

    /// The owner an evaluator's environment names; `None` when it names no
    /// application (the evaluator is not in a `cruise submit` job's
    /// service). An application without a service or an RM, or that is not
    /// an application id, is an error naming the variable.
    pub fn from_env(env: &BTreeMap<String, String>) -> Result<Option<ServiceOwner>, RmError> {
        let get = |var: &str| env.get(var).map(|v| v.trim()).filter(|v| !v.is_empty());
        let Some(application) = get(ENV_APPLICATION) else {
            return Ok(None);
        };
        if !is_application_id(application) {
            return Err(RmError::BadRequest(format!(
                "{ENV_APPLICATION}={application:?} is not a YARN application id"
            )));
        }
        let missing = |var: &str| {
            RmError::BadRequest(format!(
                "{ENV_APPLICATION} is set ({application}) but {var} is not"
            ))
        };
        let service = get(ENV_SERVICE).ok_or_else(|| missing(ENV_SERVICE))?;
        let rm_addresses: Vec<String> = get(ENV_RM)
            .ok_or_else(|| missing(ENV_RM))?
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect();
        Ok(Some(ServiceOwner {
            application: application.to_string(),
            service: service.to_string(),
            rm_addresses,
            user: get(ENV_USER).map(String::from),
        }))
    }

    /// Asks the RM about the application; if it is over, says so (a
    /// warning: the stop ends the caller's own container too) and stops
    /// the service. Bounded by `http` (its retries and timeouts) for each
    /// of the two calls.
    pub async fn stop_if_ended(&self, http: HttpOptions) -> Result<Verdict, RmError> {
        let rm = RmClient::new(&self.rm_addresses, self.user.clone(), http.clone())?;
        let state = match rm.app(&self.application).await {
            Ok(app) if !FINAL_STATES.contains(&app.state.as_str()) => {
                return Ok(Verdict::Live { state: app.state });
            }
            Ok(app) => format!("{} (final status {})", app.state, app.final_status),
            // The RM forgets ended applications (beyond
            // `yarn.resourcemanager.max-completed-applications`, or across a
            // restart without recovery); it never forgets a running one.
            Err(RmError::Http { status: 404, .. }) => "unknown to the ResourceManager".to_string(),
            Err(e) => return Err(e),
        };
        // Said before the stop: the stop ends this very container.
        tracing::warn!(
            application = %self.application,
            service = %self.service,
            "application {} is {state}: no AM of it will run again; stopping YARN service {}",
            self.application,
            self.service
        );
        let services = ServicesClient::new(&self.rm_addresses, self.user.clone(), http)?;
        let stop = services.stop(&self.service).await?;
        Ok(Verdict::Ended { state, stop })
    }

    /// What `verdict` means, in words naming the application, its state
    /// and the service.
    pub fn describe(&self, verdict: &Verdict) -> String {
        let (app, svc) = (&self.application, &self.service);
        match verdict {
            Verdict::Live { state } => format!(
                "application {app} is {state}: an attempt of its AM runs or is about to, and \
                 replaces YARN service {svc}; leaving the service running"
            ),
            Verdict::Ended { state, stop } => {
                let done = match stop {
                    StopOutcome::Stopped => "stopped YARN service",
                    StopOutcome::AlreadyStopped => "YARN service was already stopped:",
                    StopOutcome::NotFound => "YARN service no longer exists:",
                };
                format!(
                    "application {app} is {state}: no AM of it will run again; {done} {svc} \
                     (YARN relaunches its evaluators until it is stopped)"
                )
            }
        }
    }
}

/// Retries and timeouts of an evaluator's questions to the RM: a few
/// attempts, so that an evaluator whose AM is gone exits within about a
/// minute even when the RM does not answer.
pub fn http_options() -> HttpOptions {
    HttpOptions {
        retry: RetryPolicy {
            attempts: 3,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(2),
        },
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        ..HttpOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> ServiceOwner {
        ServiceOwner {
            application: "application_1700000000000_0007".into(),
            service: "cruise-1700000000000-0007".into(),
            rm_addresses: vec!["rm1:8088".into(), "http://rm2:8088".into()],
            user: Some("alice".into()),
        }
    }

    #[test]
    fn the_environment_round_trips() {
        let o = owner();
        assert_eq!(ServiceOwner::from_env(&o.env()).unwrap(), Some(o.clone()));
        let mut no_user = o.env();
        no_user.insert(ENV_USER.into(), String::new());
        assert_eq!(
            ServiceOwner::from_env(&no_user).unwrap().unwrap().user,
            None
        );
    }

    #[test]
    fn no_application_is_no_owner_and_a_partial_one_is_named() {
        assert_eq!(ServiceOwner::from_env(&BTreeMap::new()).unwrap(), None);
        let mut env = owner().env();
        env.remove(ENV_RM);
        let e = ServiceOwner::from_env(&env).unwrap_err().to_string();
        assert!(e.contains(ENV_RM), "{e}");
        let mut env = owner().env();
        env.insert(ENV_APPLICATION.into(), "job_1_2".into());
        let e = ServiceOwner::from_env(&env).unwrap_err().to_string();
        assert!(e.contains("job_1_2"), "{e}");
    }

    #[test]
    fn verdicts_name_the_application_its_state_and_the_service() {
        let o = owner();
        let live = o.describe(&Verdict::Live {
            state: "ACCEPTED".into(),
        });
        assert!(
            live.contains("application_1700000000000_0007 is ACCEPTED"),
            "{live}"
        );
        assert!(live.contains("leaving the service running"), "{live}");
        let ended = o.describe(&Verdict::Ended {
            state: "FAILED (final status FAILED)".into(),
            stop: StopOutcome::Stopped,
        });
        assert!(
            ended.contains("is FAILED (final status FAILED)")
                && ended.contains("stopped YARN service cruise-1700000000000-0007"),
            "{ended}"
        );
    }
}
