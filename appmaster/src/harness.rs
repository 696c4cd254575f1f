//! An in-process cluster: the AM and its evaluators in one process, with
//! fault verbs, for tests.
//!
//! [`InProcessRm`] is a resource manager whose containers are evaluator tasks
//! in this process, each with its own sockets (the control channel and the
//! data plane are real TCP on loopback). [`Cluster`] runs a job on it and
//! offers the verbs tests use to disturb it: [`Cluster::kill_evaluator`],
//! [`Cluster::drop_connection`], [`Cluster::delay_messages`],
//! [`Cluster::delay_data`], [`Cluster::fail_allocations`], withheld
//! allocations ([`ClusterOptions::withhold_allocations`]: a cluster that
//! never answers), [`Cluster::request_roles`] to have the job plan roles a
//! test chooses, and [`Cluster::await_status`] to wait for a condition
//! instead of sleeping.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use cruise_conf::CruiseConfig;
use cruise_container::evaluator::{self, EvaluatorEnv, EvaluatorOptions};
use cruise_container::protocol::Faults;
use cruise_rm::{
    Capacity, ContainerId, ContainerRequest, ExitStatus, LaunchSpec, ResourceManager, RmError,
    RmEvent,
};

use crate::am::{self, AmError, JobOptions, JobSummary, Progress, Status};

struct Handle {
    cancel: CancellationToken,
    killed: Arc<std::sync::atomic::AtomicBool>,
    opts: EvaluatorOptions,
    task: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct State {
    seq: u64,
    fail_allocations: u32,
    withhold_allocations: u32,
    /// Delay of every data-plane frame of containers started from now on.
    data_delay: Duration,
    containers: BTreeMap<ContainerId, Handle>,
    stopped: bool,
}

/// A resource manager whose containers are evaluator tasks in this process.
pub struct InProcessRm {
    launch: LaunchSpec,
    events: mpsc::UnboundedSender<RmEvent>,
    max: std::sync::atomic::AtomicU32,
    state: Mutex<State>,
}

impl InProcessRm {
    /// A resource manager with room for `max` containers.
    pub fn new(launch: LaunchSpec, events: mpsc::UnboundedSender<RmEvent>, max: u32) -> Self {
        InProcessRm {
            launch,
            events,
            max: std::sync::atomic::AtomicU32::new(max),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn spawn(&self, id: ContainerId) -> Result<Handle, RmError> {
        let mut env: BTreeMap<String, String> = self.launch.env.clone();
        env.insert(evaluator::ENV_CONTAINER_ID.to_string(), id.clone());
        let eenv = EvaluatorEnv::from_map(&env).map_err(|e| RmError::Other(e.to_string()))?;
        let opts = EvaluatorOptions::default();
        opts.data_faults.set_delay(self.state().data_delay);
        let cancel = CancellationToken::new();
        let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (o, c, k, events) = (
            opts.clone(),
            cancel.clone(),
            Arc::clone(&killed),
            self.events.clone(),
        );
        let task = tokio::spawn(async move {
            let r = evaluator::run(eenv, o, c).await;
            let (exit, diagnostics) = if k.load(std::sync::atomic::Ordering::SeqCst) {
                (
                    ExitStatus::Signal(9),
                    "killed by the test harness".to_string(),
                )
            } else {
                match r {
                    Ok(()) => (ExitStatus::Code(0), String::new()),
                    Err(e) => (ExitStatus::Code(1), format!("error: {e}")),
                }
            };
            let _ = events.send(RmEvent::Completed {
                container: id,
                exit,
                diagnostics,
                released: false,
            });
        });
        Ok(Handle {
            cancel,
            killed,
            opts,
            task: Some(task),
        })
    }

    /// Kills an evaluator abruptly: its connections break and it stops at once.
    pub fn kill(&self, container: &str) -> bool {
        let st = self.state();
        let Some(h) = st.containers.get(container) else {
            return false;
        };
        h.killed.store(true, std::sync::atomic::Ordering::SeqCst);
        h.opts.control_faults.break_now();
        h.opts.data_faults.break_now();
        h.cancel.cancel();
        true
    }

    /// Stops every evaluator at once (their connections break), as when
    /// the test that ran them ends early.
    fn stop_all(&self) {
        for h in self.state().containers.values() {
            h.opts.control_faults.break_now();
            h.opts.data_faults.break_now();
            h.cancel.cancel();
        }
    }

    /// Breaks an evaluator's control connection (the evaluator then exits).
    pub fn drop_connection(&self, container: &str) -> bool {
        let st = self.state();
        st.containers
            .get(container)
            .map(|h| h.opts.control_faults.break_now())
            .is_some()
    }

    /// Delays every control message an evaluator sends by `d`.
    pub fn delay_messages(&self, container: &str, d: Duration) -> bool {
        let st = self.state();
        st.containers
            .get(container)
            .map(|h| h.opts.control_faults.set_delay(d))
            .is_some()
    }

    /// Holds (`true`) every control message an evaluator sends from now
    /// on, or sends what it held (`false`): a partition between it and the
    /// AM that heals, nothing lost.
    pub fn hold_messages(&self, container: &str, hold: bool) -> bool {
        let st = self.state();
        st.containers
            .get(container)
            .map(|h| {
                if hold {
                    h.opts.control_faults.hold();
                } else {
                    h.opts.control_faults.release();
                }
            })
            .is_some()
    }

    /// Names a container the cluster takes back within `notice`, as YARN's
    /// decommissioning and Mesos's inverse offers do: the AM moves its
    /// blocks off and gives it back. False if there is no such container.
    pub fn reclaim_with_notice(&self, container: &str, notice: Duration) -> bool {
        if !self.state().containers.contains_key(container) {
            return false;
        }
        self.events
            .send(RmEvent::Reclaiming {
                containers: vec![container.to_string()],
                deadline: std::time::Instant::now() + notice,
                reason: "the test harness takes it back".into(),
            })
            .is_ok()
    }

    /// Changes the capacity and tells the AM (like a cluster offering or
    /// reclaiming resources).
    pub fn set_capacity(&self, n: u32) {
        self.max.store(n, std::sync::atomic::Ordering::SeqCst);
        let _ = self
            .events
            .send(RmEvent::CapacityChanged { max_containers: n });
    }

    fn max(&self) -> u32 {
        self.max.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The next `n` containers requested fail to allocate.
    pub fn fail_allocations(&self, n: u32) {
        self.state().fail_allocations += n;
    }

    /// The next `n` containers requested are never allocated and never
    /// refused: the request goes unanswered, as on a full cluster.
    pub fn withhold_allocations(&self, n: u32) {
        self.state().withhold_allocations += n;
    }

    /// Delays every data-plane frame of every container, running or started
    /// later, by `d` (a slow network).
    pub fn delay_data(&self, d: Duration) {
        let mut st = self.state();
        st.data_delay = d;
        for h in st.containers.values() {
            h.opts.data_faults.set_delay(d);
        }
    }

    /// Fault hooks of a container's data plane.
    pub fn data_faults(&self, container: &str) -> Option<Faults> {
        self.state()
            .containers
            .get(container)
            .map(|h| h.opts.data_faults.clone())
    }
}

#[async_trait]
impl ResourceManager for InProcessRm {
    fn name(&self) -> &'static str {
        "in-process"
    }

    async fn request(&self, req: ContainerRequest) -> Result<(), RmError> {
        for _ in 0..req.count {
            let id = {
                let mut st = self.state();
                if st.stopped {
                    return Err(RmError::Stopped("in-process"));
                }
                if st.withhold_allocations > 0 {
                    st.withhold_allocations -= 1;
                    continue;
                }
                if st.fail_allocations > 0 {
                    st.fail_allocations -= 1;
                    let _ = self.events.send(RmEvent::AllocationFailed {
                        reason: "allocation failed (injected by the test harness)".into(),
                    });
                    continue;
                }
                let live = st
                    .containers
                    .values()
                    .filter(|h| {
                        h.task.as_ref().is_some_and(|t| !t.is_finished())
                            && !h.cancel.is_cancelled()
                    })
                    .count() as u32;
                if live >= self.max() {
                    let _ = self.events.send(RmEvent::AllocationFailed {
                        reason: format!("capacity {} reached", self.max()),
                    });
                    continue;
                }
                st.seq += 1;
                format!("inproc_{:04}", st.seq)
            };
            let _ = self.events.send(RmEvent::Allocated {
                container: id.clone(),
                host: "localhost".into(),
            });
            let h = self.spawn(id.clone())?;
            self.state().containers.insert(id.clone(), h);
            let _ = self.events.send(RmEvent::Running {
                container: id,
                pid: None,
            });
        }
        Ok(())
    }

    async fn release(&self, container: &ContainerId) -> Result<(), RmError> {
        let st = self.state();
        let h = st
            .containers
            .get(container)
            .ok_or_else(|| RmError::UnknownContainer(container.clone()))?;
        h.cancel.cancel();
        Ok(())
    }

    async fn capacity(&self) -> Result<Capacity, RmError> {
        let st = self.state();
        Ok(Capacity {
            max_containers: self.max(),
            running: st
                .containers
                .values()
                .filter(|h| h.task.as_ref().is_some_and(|t| !t.is_finished()))
                .count() as u32,
        })
    }

    async fn shutdown(&self) -> Result<(), RmError> {
        let tasks: Vec<(CancellationToken, JoinHandle<()>)> = {
            let mut st = self.state();
            st.stopped = true;
            st.containers
                .values_mut()
                .filter_map(|h| h.task.take().map(|t| (h.cancel.clone(), t)))
                .collect()
        };
        for (c, t) in tasks {
            c.cancel();
            let abort = t.abort_handle();
            if tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        Ok(())
    }
}

/// A job running on an in-process cluster.
pub struct Cluster {
    rm: Arc<Mutex<Option<Arc<InProcessRm>>>>,
    status: watch::Receiver<Status>,
    /// Progress events of the job.
    pub progress: mpsc::UnboundedReceiver<Progress>,
    job: JoinHandle<Result<JobSummary, AmError>>,
    cancel: CancellationToken,
    requests: mpsc::UnboundedSender<am::Request>,
    _stop: StopOnDrop,
}

/// Cancels a cluster's job and stops its evaluators when the cluster is
/// dropped before its job ended (a test that failed half-way): otherwise
/// the evaluators' worker threads go on, and the test's runtime waits for
/// them when it shuts down, so a failed assertion hung the test binary
/// instead of failing it.
struct StopOnDrop {
    cancel: CancellationToken,
    rm: Arc<Mutex<Option<Arc<InProcessRm>>>>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(rm) = self.rm.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            rm.stop_all();
        }
    }
}

/// Faults a cluster starts with.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClusterOptions {
    /// The first `n` containers requested fail to allocate.
    pub fail_allocations: u32,
    /// The first `n` containers requested are never answered.
    pub withhold_allocations: u32,
    /// Every data-plane frame is delayed by this much (a slow network): a
    /// mini-batch then takes at least two such delays (its pull's answer and
    /// its push's acknowledgement), which bounds how soon a job can end
    /// whatever the machine's speed.
    pub data_delay: Duration,
}

impl Cluster {
    /// Starts a job. `input` is a file or directory; `work_dir` holds logs.
    pub fn start(config: CruiseConfig, input: String, work_dir: PathBuf) -> Cluster {
        Self::start_with(config, input, work_dir, ClusterOptions::default())
    }

    /// Starts a job with faults from the beginning.
    pub fn start_with(
        config: CruiseConfig,
        input: String,
        work_dir: PathBuf,
        faults: ClusterOptions,
    ) -> Cluster {
        let (ptx, prx) = mpsc::unbounded_channel();
        let (requests, requests_rx) = mpsc::unbounded_channel();
        let (status_tx, status_rx) = watch::channel(Status::default());
        let cancel = CancellationToken::new();
        let slot: Arc<Mutex<Option<Arc<InProcessRm>>>> = Arc::new(Mutex::new(None));
        let s = Arc::clone(&slot);
        let max = config.runtime.effective_max_containers(&config.job);
        let opts = JobOptions {
            rm: Box::new(move |launch, events| {
                let rm = Arc::new(InProcessRm::new(launch, events, max));
                rm.withhold_allocations(faults.withhold_allocations);
                rm.fail_allocations(faults.fail_allocations);
                rm.delay_data(faults.data_delay);
                *s.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&rm));
                Ok(rm as Arc<dyn ResourceManager>)
            }),
            config,
            input,
            progress: ptx,
            status: status_tx,
            cancel: cancel.clone(),
            work_dir,
            evaluator_command: vec!["(in-process)".into()],
            start: am::JobStart::New,
            requests: Some(requests_rx),
        };
        let job = tokio::spawn(am::run_job(opts));
        Cluster {
            _stop: StopOnDrop {
                cancel: cancel.clone(),
                rm: Arc::clone(&slot),
            },
            rm: slot,
            status: status_rx,
            progress: prx,
            job,
            cancel,
            requests,
        }
    }

    /// Asks the job to reconfigure now to `roles` (evaluator → role; the
    /// others keep theirs), whatever the optimizer predicts: a plan the test
    /// chooses. The plan's summary once it started, or why the job refused
    /// (see [`am::Request::Roles`]).
    pub async fn request_roles(
        &self,
        roles: BTreeMap<cruise_container::protocol::EvaluatorId, am::Role>,
    ) -> Result<String, String> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.requests
            .send(am::Request::Roles { roles, reply })
            .map_err(|_| "the job has ended".to_string())?;
        answer
            .await
            .map_err(|_| "the job ended before it answered".to_string())?
    }

    /// The resource manager (once the AM has built it).
    pub fn rm(&self) -> Option<Arc<InProcessRm>> {
        self.rm.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The current status.
    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// Waits until the status satisfies `pred` (or the timeout passes, or the
    /// job ends). Returns the status that satisfied it.
    pub async fn await_status(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&Status) -> bool,
    ) -> Result<Status, String> {
        let wait = async {
            loop {
                {
                    let s = self.status.borrow_and_update();
                    if pred(&s) {
                        return Ok(s.clone());
                    }
                }
                if self.status.changed().await.is_err() {
                    return Err(format!(
                        "the job ended first; last status: {:?}",
                        *self.status.borrow()
                    ));
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "timed out; last status: {:?}",
                    *self.status.borrow()
                ))
            })
    }

    /// The container of evaluator `id`, from the status.
    pub fn container_of(&self, id: cruise_container::protocol::EvaluatorId) -> Option<String> {
        self.status
            .borrow()
            .evaluators
            .iter()
            .find(|e| e.id == id)
            .map(|e| e.container.clone())
    }

    /// Kills an evaluator abruptly.
    pub fn kill_evaluator(&self, container: &str) -> bool {
        self.rm().is_some_and(|rm| rm.kill(container))
    }

    /// Breaks an evaluator's control connection.
    pub fn drop_connection(&self, container: &str) -> bool {
        self.rm().is_some_and(|rm| rm.drop_connection(container))
    }

    /// Delays an evaluator's control messages.
    pub fn delay_messages(&self, container: &str, d: Duration) -> bool {
        self.rm().is_some_and(|rm| rm.delay_messages(container, d))
    }

    /// Holds an evaluator's control messages (`true`) or sends what it
    /// held (`false`).
    pub fn hold_messages(&self, container: &str, hold: bool) -> bool {
        self.rm()
            .is_some_and(|rm| rm.hold_messages(container, hold))
    }

    /// Takes a container back with notice (see
    /// [`InProcessRm::reclaim_with_notice`]).
    pub fn reclaim_with_notice(&self, container: &str, notice: Duration) -> bool {
        self.rm()
            .is_some_and(|rm| rm.reclaim_with_notice(container, notice))
    }

    /// Changes the capacity the resource manager offers.
    pub fn set_capacity(&self, n: u32) -> bool {
        self.rm().map(|rm| rm.set_capacity(n)).is_some()
    }

    /// Makes the next `n` allocations fail.
    pub fn fail_allocations(&self, n: u32) -> bool {
        self.rm().map(|rm| rm.fail_allocations(n)).is_some()
    }

    /// Delays every data-plane frame of every evaluator by `d` from now on.
    pub fn delay_data(&self, d: Duration) -> bool {
        self.rm().map(|rm| rm.delay_data(d)).is_some()
    }

    /// Cancels the job.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Waits for the job to end.
    pub async fn join(self) -> Result<JobSummary, AmError> {
        match self.job.await {
            Ok(r) => r,
            Err(e) => Err(AmError::JobFailed(format!("the AM task panicked: {e}"))),
        }
    }
}

/// Writes a small MLR data set for harness jobs (100 features, 4 classes,
/// 10 non-zeros per record) to `dir/train.libsvm`; returns its path.
pub fn mlr_data(dir: &std::path::Path, samples: u64, seed: u64) -> std::io::Result<String> {
    use std::io::Write;
    let path = dir.join("train.libsvm");
    let p = cruise_container::apps::mlr::GenParams {
        samples,
        features: 100,
        classes: 4,
        nnz: 10,
        seed,
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
    cruise_container::apps::mlr::generate(&p, &mut f)?;
    f.flush()?;
    Ok(path.display().to_string())
}

/// Writes a small LDA corpus for harness jobs (600 documents of about 60
/// tokens over 100 words, 4 topics) to `dir/lda.txt`; returns its path
/// and its tokens.
pub fn lda_data(dir: &std::path::Path) -> std::io::Result<(String, u64)> {
    use std::io::Write;
    let path = dir.join("lda.txt");
    let p = cruise_container::apps::lda::GenParams {
        docs: 600,
        vocab: 100,
        topics: 4,
        doc_len: 60,
        alpha: 0.1,
        beta: 0.05,
        seed: 13,
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
    let (_, truth) = cruise_container::apps::lda::generate(&p, &mut f)?;
    f.flush()?;
    Ok((path.display().to_string(), truth.tokens))
}

/// The sums of an LDA model written by `job.model_out` (lines `key
/// value...`, `#` comments): of its word rows (keys below `vocab`), and of
/// its summary row (key `vocab`, the topic totals). A model that agrees
/// with its topic assignments has both equal to the corpus's tokens.
pub fn lda_model_sums(model: &std::path::Path, vocab: u64) -> std::io::Result<(f64, f64)> {
    let bad = |line: &str| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: not a model line: {line:?}", model.display()),
        )
    };
    let (mut words, mut summary) = (0.0, 0.0);
    for line in std::fs::read_to_string(model)?
        .lines()
        .filter(|l| !l.starts_with('#'))
    {
        let mut it = line.split_ascii_whitespace();
        let key: u64 = it
            .next()
            .and_then(|k| k.parse().ok())
            .ok_or_else(|| bad(line))?;
        let mut sum = 0.0;
        for v in it {
            sum += v.parse::<f64>().map_err(|_| bad(line))?;
        }
        if key == vocab {
            summary += sum;
        } else {
            words += sum;
        }
    }
    Ok((words, summary))
}
