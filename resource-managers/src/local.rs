//! The local resource manager: every container is an evaluator process on
//! this machine.
//!
//! One actor task owns the processes. Requests beyond the capacity wait until
//! containers end. Releasing a container sends SIGTERM, then SIGKILL after
//! the grace period. Each container's stdout and stderr go to files in
//! `<work dir>/containers/<id>/`; when a container ends, its exit status and
//! the tail of its stderr are reported in [`RmEvent::Completed`].
//!
//! With an [`Emulation`] the actor also owns the emulated cluster: each
//! container is placed (its namespace and cgroup, or its throttling
//! environment) before its process starts, released when it ends, and the
//! rest is removed when the actor stops.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::actor::{ActorHandle, Cmd, Reply};
use crate::emulation::{Emulation, Placement};
use crate::{Capacity, ContainerId, ContainerRequest, ExitStatus, LaunchSpec, RmError, RmEvent};

/// Environment variable carrying the container id to the evaluator.
pub const CONTAINER_ID_ENV: &str = "CRUISE_CONTAINER_ID";
/// Bytes of stderr reported when a container ends.
const STDERR_TAIL: u64 = 4096;

/// Settings of the local resource manager.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// Most containers at once.
    pub max_containers: u32,
    /// Time between SIGTERM and SIGKILL on release.
    pub release_grace: Duration,
    /// Prefix of container ids (e.g. derived from the job id).
    pub id_prefix: String,
    /// Capacity over time: `(time after start, containers)`.
    pub capacity_schedule: Vec<(Duration, u32)>,
    /// After the capacity shrinks, how long before the newest containers
    /// beyond it are killed.
    pub reclaim_deadline: Duration,
}

enum Internal {
    Exited {
        id: ContainerId,
        status: std::io::Result<std::process::ExitStatus>,
    },
    KillDeadline {
        id: ContainerId,
    },
    Capacity(u32),
    ReclaimDeadline {
        generation: u64,
    },
}

/// The local resource manager (a handle to its actor).
pub struct LocalRm {
    actor: ActorHandle,
    emulation: Option<String>,
}

impl LocalRm {
    /// Starts the actor. Events go to `events`.
    pub fn start(
        config: LocalConfig,
        launch: LaunchSpec,
        events: mpsc::UnboundedSender<RmEvent>,
    ) -> LocalRm {
        Self::start_emulated(config, launch, events, None)
    }

    /// Starts the actor with its containers on an emulated cluster (prepared
    /// beforehand: under the kernel mechanism the AM must listen on the
    /// bridge before evaluators start). The actor owns it from now on.
    pub fn start_emulated(
        config: LocalConfig,
        launch: LaunchSpec,
        events: mpsc::UnboundedSender<RmEvent>,
        emulation: Option<Emulation>,
    ) -> LocalRm {
        let description = emulation.as_ref().map(Emulation::describe);
        let actor = Actor {
            config,
            launch,
            events,
            running: BTreeMap::new(),
            pending: 0,
            seq: 0,
            tracker: TaskTracker::new(),
            timers: CancellationToken::new(),
            generation: 0,
            emulation,
        };
        LocalRm {
            actor: ActorHandle::spawn("local", |cmds| actor.run(cmds)),
            emulation: description,
        }
    }
}

crate::actor::resource_manager_via_actor!(LocalRm, "local", emulation = emulation);

struct Proc {
    pid: Option<u32>,
    dir: PathBuf,
    released: bool,
    preempted: bool,
    /// Cancels the kill deadline of a released process once it has exited.
    exited: CancellationToken,
}

struct Actor {
    config: LocalConfig,
    launch: LaunchSpec,
    events: mpsc::UnboundedSender<RmEvent>,
    running: BTreeMap<ContainerId, Proc>,
    pending: u32,
    seq: u64,
    tracker: TaskTracker,
    /// Cancels the schedule and deadline timers at shutdown.
    timers: CancellationToken,
    /// Bumped at every capacity change; a reclaim deadline of an older
    /// change is ignored.
    generation: u64,
    /// The emulated cluster, if any.
    emulation: Option<Emulation>,
}

impl Actor {
    async fn run(mut self, mut cmds: mpsc::Receiver<Cmd>) {
        let (int_tx, mut int_rx) = mpsc::unbounded_channel::<Internal>();
        let mut shutting_down: Option<Reply<()>> = None;
        if !self.config.capacity_schedule.is_empty() {
            let (steps, tx, cancel) = (
                self.config.capacity_schedule.clone(),
                int_tx.clone(),
                self.timers.clone(),
            );
            self.tracker.spawn(async move {
                let start = tokio::time::Instant::now();
                for (at, n) in steps {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep_until(start + at) => {}
                    }
                    if tx.send(Internal::Capacity(n)).is_err() {
                        return;
                    }
                }
            });
        }
        loop {
            if shutting_down.is_some() && self.running.is_empty() {
                break;
            }
            tokio::select! {
                cmd = cmds.recv(), if shutting_down.is_none() => match cmd {
                    Some(Cmd::Request(req, reply)) => {
                        let r = self.request(req, &int_tx);
                        let _ = reply.send(r);
                    }
                    Some(Cmd::Release(id, reply)) => {
                        let _ = reply.send(self.release(&id, &int_tx));
                    }
                    Some(Cmd::Capacity(reply)) => {
                        let _ = reply.send(Ok(Capacity {
                            max_containers: self.config.max_containers,
                            running: self.running.len() as u32,
                        }));
                    }
                    Some(Cmd::Shutdown(reply)) => {
                        self.timers.cancel();
                        self.pending = 0;
                        let ids: Vec<ContainerId> = self.running.keys().cloned().collect();
                        for id in ids {
                            let _ = self.release(&id, &int_tx);
                        }
                        shutting_down = Some(reply);
                    }
                    None => {
                        // Every handle is gone: stop everything.
                        self.timers.cancel();
                        self.pending = 0;
                        let ids: Vec<ContainerId> = self.running.keys().cloned().collect();
                        for id in ids {
                            let _ = self.release(&id, &int_tx);
                        }
                        if self.running.is_empty() {
                            break;
                        }
                        let (tx, _rx) = oneshot::channel();
                        shutting_down = Some(tx);
                    }
                },
                Some(ev) = int_rx.recv() => match ev {
                    Internal::Exited { id, status } => self.exited(id, status, &int_tx),
                    Internal::Capacity(n) if shutting_down.is_none() => self.set_capacity(n, &int_tx),
                    Internal::Capacity(_) => {}
                    Internal::ReclaimDeadline { generation } => {
                        if generation == self.generation {
                            self.preempt();
                        }
                    }
                    Internal::KillDeadline { id } => {
                        if let Some(p) = self.running.get(&id)
                            && let Some(pid) = p.pid
                        {
                            tracing::warn!(container = %id, "did not stop within {:?}; killing it", self.config.release_grace);
                            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                        }
                    }
                },
            }
        }
        self.tracker.close();
        self.tracker.wait().await;
        if let Some(e) = &mut self.emulation {
            e.shutdown();
        }
        if let Some(reply) = shutting_down {
            let _ = reply.send(Ok(()));
        }
    }

    fn set_capacity(&mut self, n: u32, int_tx: &mpsc::UnboundedSender<Internal>) {
        self.config.max_containers = n;
        self.generation += 1;
        tracing::info!(
            capacity = n,
            running = self.running.len(),
            "local runtime capacity changed"
        );
        let _ = self
            .events
            .send(RmEvent::CapacityChanged { max_containers: n });
        if self.held() > n {
            let (tx, generation, cancel) = (int_tx.clone(), self.generation, self.timers.clone());
            let deadline = self.config.reclaim_deadline;
            self.tracker.spawn(async move {
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = tokio::time::sleep(deadline) => {
                        let _ = tx.send(Internal::ReclaimDeadline { generation });
                    }
                }
            });
        }
        self.launch_pending(int_tx);
    }

    /// Containers counted against the capacity (released ones are leaving).
    fn held(&self) -> u32 {
        self.running.values().filter(|p| !p.released).count() as u32
    }

    /// Kills the newest containers beyond the capacity (the job did not give
    /// them back in time).
    fn preempt(&mut self) {
        let excess = self.held().saturating_sub(self.config.max_containers) as usize;
        let victims: Vec<ContainerId> = self
            .running
            .iter()
            .rev()
            .filter(|(_, p)| !p.released)
            .take(excess)
            .map(|(id, _)| id.clone())
            .collect();
        for id in victims {
            if let Some(p) = self.running.get_mut(&id) {
                tracing::warn!(container = %id, "preempting: capacity is {} and the job did not give it back in time", self.config.max_containers);
                p.preempted = true;
                if let Some(pid) = p.pid {
                    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                }
            }
        }
    }

    fn request(
        &mut self,
        req: ContainerRequest,
        int_tx: &mpsc::UnboundedSender<Internal>,
    ) -> Result<(), RmError> {
        if req.count == 0 {
            return Ok(());
        }
        self.pending += req.count;
        self.launch_pending(int_tx);
        Ok(())
    }

    fn launch_pending(&mut self, int_tx: &mpsc::UnboundedSender<Internal>) {
        while self.pending > 0 && (self.running.len() as u32) < self.config.max_containers {
            // (released containers still count until they are gone)
            self.pending -= 1;
            self.seq += 1;
            let id = format!("{}_{:06}", self.config.id_prefix, self.seq);
            let seq = self.seq;
            self.launch_one(id, seq, int_tx);
        }
    }

    fn launch_one(&mut self, id: ContainerId, seq: u64, int_tx: &mpsc::UnboundedSender<Internal>) {
        let _ = self.events.send(RmEvent::Allocated {
            container: id.clone(),
            host: "localhost".into(),
        });
        let dir = self.launch.work_dir.join("containers").join(&id);
        let placement = match self.emulation.as_mut().map(|e| e.place(&id, seq)) {
            None => Ok(Placement::default()),
            Some(Ok(p)) => {
                tracing::info!(container = %id, "emulated: {}", p.note);
                Ok(p)
            }
            Some(Err(e)) => Err(e),
        };
        let spawned = placement.and_then(|p| spawn(&self.launch, &id, &dir, p));
        if spawned.is_err()
            && let Some(e) = &mut self.emulation
        {
            e.release(&id);
        }
        match spawned {
            Ok(mut child) => {
                let pid = child.id();
                self.running.insert(
                    id.clone(),
                    Proc {
                        pid,
                        dir,
                        released: false,
                        preempted: false,
                        exited: CancellationToken::new(),
                    },
                );
                let _ = self.events.send(RmEvent::Running {
                    container: id.clone(),
                    pid,
                });
                let tx = int_tx.clone();
                self.tracker.spawn(async move {
                    let status = child.wait().await;
                    let _ = tx.send(Internal::Exited { id, status });
                });
            }
            Err(e) => {
                let _ = self.events.send(RmEvent::Completed {
                    container: id,
                    exit: ExitStatus::Unknown,
                    diagnostics: e.to_string(),
                    released: false,
                });
            }
        }
    }

    fn release(
        &mut self,
        id: &ContainerId,
        int_tx: &mpsc::UnboundedSender<Internal>,
    ) -> Result<(), RmError> {
        let p = self
            .running
            .get_mut(id)
            .ok_or_else(|| RmError::UnknownContainer(id.clone()))?;
        if p.released {
            return Ok(());
        }
        p.released = true;
        if let Some(pid) = p.pid {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
        let tx = int_tx.clone();
        let grace = self.config.release_grace;
        let id = id.clone();
        let exited = p.exited.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(grace) => {
                    let _ = tx.send(Internal::KillDeadline { id });
                }
                _ = exited.cancelled() => {}
            }
        });
        Ok(())
    }

    fn exited(
        &mut self,
        id: ContainerId,
        status: std::io::Result<std::process::ExitStatus>,
        int_tx: &mpsc::UnboundedSender<Internal>,
    ) {
        let Some(p) = self.running.remove(&id) else {
            return;
        };
        p.exited.cancel();
        if let Some(e) = &mut self.emulation {
            e.release(&id);
        }
        let exit = match status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                match (s.code(), s.signal()) {
                    (Some(c), _) => ExitStatus::Code(c),
                    (None, Some(sig)) => ExitStatus::Signal(sig),
                    _ => ExitStatus::Unknown,
                }
            }
            Err(_) => ExitStatus::Unknown,
        };
        let mut diagnostics = stderr_tail(&p.dir.join("stderr"));
        if p.preempted {
            diagnostics = format!(
                "preempted: the capacity shrank to {} containers and the job did not release this one within {:?}\n{diagnostics}",
                self.config.max_containers, self.config.reclaim_deadline
            );
        }
        let _ = self.events.send(RmEvent::Completed {
            container: id,
            exit,
            diagnostics,
            released: p.released,
        });
        self.launch_pending(int_tx);
    }
}

fn spawn(
    launch: &LaunchSpec,
    id: &str,
    dir: &Path,
    placement: Placement,
) -> Result<tokio::process::Child, RmError> {
    use std::os::fd::AsRawFd;
    let fail = |source: std::io::Error| RmError::Launch {
        program: launch.program.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let stdout = std::fs::File::create(dir.join("stdout")).map_err(fail)?;
    let stderr = std::fs::File::create(dir.join("stderr")).map_err(fail)?;
    let mut cmd = tokio::process::Command::new(&launch.program);
    cmd.args(&launch.args)
        .envs(&launch.env)
        .envs(placement.env.iter().map(|(k, v)| (k, v)))
        .env(CONTAINER_ID_ENV, id)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .kill_on_drop(true);
    let cgroup = placement.cgroup_procs.as_ref().map(|f| f.as_raw_fd());
    let netns = placement.netns.as_ref().map(|f| f.as_raw_fd());
    if cgroup.is_some() || netns.is_some() {
        // SAFETY: between fork and exec the closure only makes two
        // async-signal-safe system calls on descriptors opened before the
        // fork (kept open by `placement` until `spawn` returns): writing "0"
        // to a cgroup's `cgroup.procs` moves the calling process into it,
        // and `setns` moves it into the container's network namespace.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = cgroup
                    && libc::write(fd, b"0".as_ptr().cast(), 1) != 1
                {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(fd) = netns
                    && libc::setns(fd, libc::CLONE_NEWNET) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let child = cmd.spawn().map_err(fail);
    drop(placement);
    child
}

/// The last lines of a file (at most a few KiB), for diagnostics.
pub fn stderr_tail(path: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(STDERR_TAIL);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let text = if start > 0 {
        // Drop the partial first line.
        text.split_once('\n')
            .map_or(&*text, |(_, rest)| rest)
            .to_string()
    } else {
        text.into_owned()
    };
    text.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ResourceManager;

    fn spec(dir: &Path, program: &str, args: &[&str]) -> LaunchSpec {
        LaunchSpec {
            program: program.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::from([("GREETING".to_string(), "hello".to_string())]),
            work_dir: dir.to_path_buf(),
        }
    }

    fn rm(
        dir: &Path,
        max: u32,
        program: &str,
        args: &[&str],
    ) -> (LocalRm, mpsc::UnboundedReceiver<RmEvent>) {
        rm_on(dir, max, program, args, None)
    }

    /// A local resource manager whose containers run `sh -c script`.
    fn sh(dir: &Path, max: u32, script: &str) -> (LocalRm, mpsc::UnboundedReceiver<RmEvent>) {
        rm(dir, max, "/bin/sh", &["-c", script])
    }

    /// [`sh`] in a new folder, asked for one container.
    async fn one_sh_container(
        max: u32,
        script: &str,
    ) -> (tempfile::TempDir, LocalRm, mpsc::UnboundedReceiver<RmEvent>) {
        let dir = tempfile::tempdir().unwrap();
        let (rm, rx) = sh(dir.path(), max, script);
        rm.request(one_container()).await.unwrap();
        (dir, rm, rx)
    }

    fn rm_on(
        dir: &Path,
        max: u32,
        program: &str,
        args: &[&str],
        emulation: Option<Emulation>,
    ) -> (LocalRm, mpsc::UnboundedReceiver<RmEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let cfg = LocalConfig {
            max_containers: max,
            release_grace: Duration::from_millis(300),
            id_prefix: "container_test".into(),
            capacity_schedule: Vec::new(),
            reclaim_deadline: Duration::from_secs(30),
        };
        let launch = spec(dir, program, args);
        (LocalRm::start_emulated(cfg, launch, tx, emulation), rx)
    }

    fn one_container() -> ContainerRequest {
        containers(1)
    }

    /// `count` containers of 64 MB and one core, anywhere.
    fn containers(count: u32) -> ContainerRequest {
        ContainerRequest {
            count,
            memory_mb: 64,
            cores: 1,
            hosts: vec![],
        }
    }

    async fn next_completed(
        rx: &mut mpsc::UnboundedReceiver<RmEvent>,
    ) -> (ContainerId, ExitStatus, String, bool) {
        loop {
            match tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
                Ok(Some(RmEvent::Completed {
                    container,
                    exit,
                    diagnostics,
                    released,
                })) => return (container, exit, diagnostics, released),
                Ok(Some(_)) => continue,
                other => panic!("no completion: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn exit_status_and_stderr_tail_reported() {
        let (_dir, rm, mut rx) = one_sh_container(
            2,
            "echo \"$GREETING from $CRUISE_CONTAINER_ID\" >&2; exit 3",
        )
        .await;
        let (id, exit, diag, released) = next_completed(&mut rx).await;
        assert_eq!(exit, ExitStatus::Code(3));
        assert_eq!(diag, format!("hello from {id}"));
        assert!(!released);
        rm.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn release_terms_then_kills() {
        // Ignores SIGTERM, so the release must end in SIGKILL.
        let (dir, rm, mut rx) = one_sh_container(
            1,
            "trap '' TERM; echo ready; while true; do sleep 0.05; done",
        )
        .await;
        let id = loop {
            if let Some(RmEvent::Running { container, .. }) = rx.recv().await {
                break container;
            }
        };
        // Wait until the shell has installed its trap (it prints "ready").
        let out = dir.path().join("containers").join(&id).join("stdout");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&out).unwrap_or_default().trim() != "ready" {
            assert!(std::time::Instant::now() < deadline, "never ready");
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        rm.release(&id).await.unwrap();
        let (cid, exit, _, released) = next_completed(&mut rx).await;
        assert_eq!(cid, id);
        assert_eq!(exit, ExitStatus::Signal(9));
        assert!(released);
        rm.shutdown().await.unwrap();
    }

    /// A released process that exits at SIGTERM ends its kill deadline: the
    /// shutdown does not sit out the grace period (10 min here; the wait
    /// below gives up long before).
    #[tokio::test]
    async fn shutdown_does_not_wait_out_the_grace_of_exited_processes() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let cfg = LocalConfig {
            max_containers: 1,
            release_grace: Duration::from_secs(600),
            id_prefix: "container_test".into(),
            capacity_schedule: Vec::new(),
            reclaim_deadline: Duration::from_secs(30),
        };
        let launch = spec(dir.path(), "/bin/sh", &["-c", "exec sleep 600"]);
        let rm = LocalRm::start_emulated(cfg, launch, tx, None);
        rm.request(one_container()).await.unwrap();
        let id = loop {
            if let Some(RmEvent::Running { container, .. }) = rx.recv().await {
                break container;
            }
        };
        rm.release(&id).await.unwrap();
        let (_, exit, _, released) = next_completed(&mut rx).await;
        assert_eq!(exit, ExitStatus::Signal(15));
        assert!(released);
        tokio::time::timeout(Duration::from_secs(60), rm.shutdown())
            .await
            .expect("the shutdown waited for a moot kill deadline")
            .unwrap();
    }

    #[tokio::test]
    async fn capacity_queues_requests() {
        let dir = tempfile::tempdir().unwrap();
        let (rm, mut rx) = sh(dir.path(), 2, "exit 0");
        rm.request(containers(5)).await.unwrap();
        let mut done = 0;
        let mut max_running = 0i32;
        let mut running = 0i32;
        while done < 5 {
            match tokio::time::timeout(Duration::from_secs(20), rx.recv())
                .await
                .unwrap()
                .unwrap()
            {
                RmEvent::Running { .. } => {
                    running += 1;
                    max_running = max_running.max(running);
                }
                RmEvent::Completed { exit, .. } => {
                    assert_eq!(exit, ExitStatus::Code(0));
                    running -= 1;
                    done += 1;
                }
                _ => {}
            }
        }
        assert!(
            max_running <= 2,
            "at most the capacity runs at once: {max_running}"
        );
        assert_eq!(
            rm.capacity().await.unwrap(),
            Capacity {
                max_containers: 2,
                running: 0
            }
        );
        rm.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn bad_program_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (rm, mut rx) = rm(dir.path(), 1, "/nonexistent/evaluator", &[]);
        rm.request(one_container()).await.unwrap();
        let (_, exit, diag, _) = next_completed(&mut rx).await;
        assert_eq!(exit, ExitStatus::Unknown);
        assert!(diag.contains("/nonexistent/evaluator"), "{diag}");
        rm.shutdown().await.unwrap();
    }

    #[tokio::test]
    async fn shutdown_stops_everything() {
        let dir = tempfile::tempdir().unwrap();
        let (rm, mut rx) = sh(dir.path(), 3, "while true; do sleep 0.05; done");
        rm.request(containers(3)).await.unwrap();
        rm.shutdown().await.unwrap();
        let mut completed = 0;
        while let Ok(ev) = rx.try_recv() {
            if let RmEvent::Completed { released, .. } = ev {
                assert!(released);
                completed += 1;
            }
        }
        assert_eq!(completed, 3);
        assert!(
            rm.request(ContainerRequest {
                count: 1,
                memory_mb: 1,
                cores: 1,
                hosts: vec![]
            })
            .await
            .is_err()
        );
    }

    #[tokio::test]
    async fn capacity_schedule_grows_then_preempts_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let cfg = LocalConfig {
            max_containers: 1,
            release_grace: Duration::from_millis(300),
            id_prefix: "c".into(),
            capacity_schedule: vec![
                (Duration::from_millis(50), 3),
                (Duration::from_millis(400), 1),
            ],
            reclaim_deadline: Duration::from_millis(200),
        };
        let rm = LocalRm::start(
            cfg,
            spec(
                dir.path(),
                "/bin/sh",
                &["-c", "while true; do sleep 0.05; done"],
            ),
            tx,
        );
        rm.request(containers(3)).await.unwrap();
        let mut seen = Vec::new();
        let mut running = 0;
        let mut max_running = 0;
        let mut preempted = Vec::new();
        while preempted.len() < 2 {
            match tokio::time::timeout(Duration::from_secs(20), rx.recv())
                .await
                .unwrap()
                .unwrap()
            {
                RmEvent::CapacityChanged { max_containers } => seen.push(max_containers),
                RmEvent::Running { .. } => {
                    running += 1;
                    max_running = max_running.max(running);
                }
                RmEvent::Completed {
                    container,
                    diagnostics,
                    released,
                    exit,
                } => {
                    running -= 1;
                    assert!(!released);
                    assert_eq!(exit, ExitStatus::Signal(9));
                    assert!(
                        diagnostics.starts_with("preempted: the capacity shrank to 1"),
                        "{diagnostics}"
                    );
                    preempted.push(container);
                }
                _ => {}
            }
        }
        assert_eq!(seen, vec![3, 1]);
        assert_eq!(max_running, 3, "growth launched the queued requests");
        preempted.sort();
        assert_eq!(
            preempted,
            vec!["c_000002".to_string(), "c_000003".to_string()],
            "the newest go first"
        );
        rm.shutdown().await.unwrap();
    }

    /// Under the kernel mechanism a container's process runs in its own
    /// network namespace, behind its token-bucket filters and in its cgroup,
    /// and all of it is gone once the container ends and the runtime stops.
    /// Needs root (skipped otherwise; CI runs as root).
    #[tokio::test]
    async fn kernel_emulation_places_containers_and_cleans_up() {
        use crate::emulation::{
            CgroupCpu, Choice, EmulationSpec, HostFacts, Mechanism, ProcessEnv, Shape,
        };
        let facts = HostFacts::probe();
        if !facts.root || facts.ip.is_none() || facts.tc.is_none() || facts.cgroup.is_none() {
            eprintln!(
                "skipped: the kernel emulation needs root, ip, tc and a cgroup cpu controller ({facts:?})"
            );
            return;
        }
        let emu_spec = EmulationSpec {
            shapes: vec![Shape {
                cpu: Some(0.5),
                bits_per_sec: Some(5e7),
            }],
            choice: Choice::Kernel,
            subnet: [10, 78, 251],
            cpu_period: Duration::from_millis(10),
            env: ProcessEnv {
                cpu: "CPU".into(),
                bytes_per_sec: "BW".into(),
            },
        };
        let emulation = Emulation::prepare(emu_spec).unwrap();
        assert_eq!(emulation.mechanism(), Mechanism::Kernel);
        assert_eq!(
            emulation.am_ip(),
            Some(std::net::Ipv4Addr::new(10, 78, 251, 1))
        );
        let tag = std::process::id();
        let bridge = format!("crb{tag}");
        let netns = format!("cruise-{tag}-1");
        let links = || {
            std::process::Command::new("ip")
                .args(["-o", "link", "show"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
                .unwrap_or_default()
        };
        assert!(links().contains(&bridge), "no bridge {bridge}");

        let dir = tempfile::tempdir().unwrap();
        // Its cgroup: the `cpu` line under v1, the unified `0::` line under v2.
        let script = "ip -o -4 addr show; tc qdisc show dev eth0; grep -E ':cpu(,|:)|^0::' /proc/self/cgroup";
        let (rm, mut rx) = rm_on(dir.path(), 1, "/bin/sh", &["-c", script], Some(emulation));
        assert!(rm.emulation().is_some_and(|e| e.starts_with("kernel")));
        rm.request(one_container()).await.unwrap();
        let (id, exit, diag, _) = next_completed(&mut rx).await;
        assert_eq!(exit, ExitStatus::Code(0), "{diag}");
        let out = std::fs::read_to_string(dir.path().join("containers").join(&id).join("stdout"))
            .unwrap();
        assert!(
            out.contains("10.78.251.2/24"),
            "not in its namespace: {out}"
        );
        assert!(!out.contains("10.78.251.1/"), "sees the bridge: {out}");
        assert!(out.contains("tbf") && out.contains("50Mbit"), "{out}");
        assert!(out.contains(&netns), "not in its cgroup: {out}");

        // The container ended: its namespace is gone; the bridge stays
        // until the runtime stops.
        let namespaces = std::fs::read_dir("/run/netns")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        assert!(!namespaces.contains(&netns), "{namespaces:?}");
        assert!(links().contains(&bridge));
        rm.shutdown().await.unwrap();
        assert!(!links().contains(&bridge), "bridge left behind");
        assert!(!links().contains(&format!("crv{tag}x")), "veth left behind");
        if let Some(CgroupCpu::V1(root) | CgroupCpu::V2(root)) = &facts.cgroup {
            assert!(
                !root.join(&netns).exists(),
                "cgroup left behind in {}",
                root.display()
            );
        }
    }

    #[test]
    fn tail_drops_partial_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e");
        let mut s = String::new();
        for i in 0..2000 {
            s.push_str(&format!("line {i}\n"));
        }
        std::fs::write(&p, s).unwrap();
        let t = stderr_tail(&p);
        assert!(t.ends_with("line 1999"));
        assert!(t.lines().next().unwrap().starts_with("line "));
        assert!(t.len() <= STDERR_TAIL as usize);
    }
}
