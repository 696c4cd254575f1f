//! The handle every resource manager gives out: its actor owns the state,
//! the handle sends it [`Cmd`]s and waits for the answers.
//!
//! Each implementation ([`crate::local`], [`crate::yarn`], [`crate::mesos`])
//! runs one actor task that receives [`Cmd`]s in a `select!` beside its own
//! timers and notes, and answers each on the [`Reply`] it carries. The
//! [`ActorHandle`] is the [`crate::ResourceManager`] side of that: it
//! spawns the actor, turns each trait call into a command, and at shutdown
//! waits for the actor's task to end.
//!
//! An actor dropped without shutdown leaves its cluster-side resources
//! behind; each implementation's guard cleans them up from `Drop` with
//! [`clean_up_blocking`].

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::http::{HttpOptions, RetryPolicy};
use crate::{Capacity, ContainerId, ContainerRequest, RmError};

/// Runs a guard's clean-up on a thread of its own, in a runtime of its own
/// (the dropping thread may be inside a runtime, or its runtime may be
/// gone), and waits for it: a few seconds at most, since `cleanup` gets
/// HTTP options with three attempts and short timeouts. Nothing runs if
/// the runtime cannot be built.
pub(crate) fn clean_up_blocking<F, Fut>(cleanup: F)
where
    F: FnOnce(HttpOptions) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let t = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        let opts = HttpOptions {
            retry: RetryPolicy {
                attempts: 3,
                initial_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_millis(500),
            },
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            ..HttpOptions::default()
        };
        rt.block_on(cleanup(opts));
    });
    let _ = t.join();
}

/// Implements [`crate::ResourceManager`] for a type whose `actor` field is
/// an [`ActorHandle`]: requests, releases, capacity and shutdown are the
/// actor's commands. `emulation = field` also reports that field (an
/// `Option<String>`) as the emulated cluster.
macro_rules! resource_manager_via_actor {
    ($t:ty, $name:literal $(, emulation = $em:ident)?) => {
        #[async_trait::async_trait]
        impl $crate::ResourceManager for $t {
            fn name(&self) -> &'static str {
                $name
            }

            async fn request(
                &self,
                req: $crate::ContainerRequest,
            ) -> Result<(), $crate::RmError> {
                self.actor.request(req).await
            }

            async fn release(&self, container: &$crate::ContainerId) -> Result<(), $crate::RmError> {
                self.actor.release(container).await
            }

            async fn capacity(&self) -> Result<$crate::Capacity, $crate::RmError> {
                self.actor.capacity().await
            }

            async fn shutdown(&self) -> Result<(), $crate::RmError> {
                self.actor.shutdown().await
            }

            $(
                fn emulation(&self) -> Option<String> {
                    self.$em.clone()
                }
            )?
        }
    };
}
pub(crate) use resource_manager_via_actor;

/// Where an actor sends its answer to one command.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, RmError>>;

/// A command to a resource manager's actor.
pub(crate) enum Cmd {
    /// [`crate::ResourceManager::request`].
    Request(ContainerRequest, Reply<()>),
    /// [`crate::ResourceManager::release`].
    Release(ContainerId, Reply<()>),
    /// [`crate::ResourceManager::capacity`].
    Capacity(Reply<Capacity>),
    /// [`crate::ResourceManager::shutdown`]: the actor answers once it has
    /// released what it holds, then ends.
    Shutdown(Reply<()>),
}

/// Commands an actor may have queued before it reads them.
const QUEUE: usize = 64;

/// A running actor: its command queue and its task.
pub(crate) struct ActorHandle {
    /// The resource manager's name, for [`RmError::Stopped`].
    name: &'static str,
    cmd: mpsc::Sender<Cmd>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl ActorHandle {
    /// Spawns the actor `run` makes of its command queue.
    pub(crate) fn spawn<F>(name: &'static str, run: impl FnOnce(mpsc::Receiver<Cmd>) -> F) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (cmd, rx) = mpsc::channel(QUEUE);
        ActorHandle {
            name,
            cmd,
            task: Mutex::new(Some(tokio::spawn(run(rx)))),
        }
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Cmd) -> Result<T, RmError> {
        let (tx, rx) = oneshot::channel();
        self.cmd
            .send(make(tx))
            .await
            .map_err(|_| RmError::Stopped(self.name))?;
        rx.await.map_err(|_| RmError::Stopped(self.name))?
    }

    pub(crate) async fn request(&self, req: ContainerRequest) -> Result<(), RmError> {
        self.call(|tx| Cmd::Request(req, tx)).await
    }

    pub(crate) async fn release(&self, container: &ContainerId) -> Result<(), RmError> {
        let id = container.clone();
        self.call(|tx| Cmd::Release(id, tx)).await
    }

    pub(crate) async fn capacity(&self) -> Result<Capacity, RmError> {
        self.call(Cmd::Capacity).await
    }

    /// Asks the actor to shut down and waits for its task to end. An actor
    /// already gone has nothing left to shut down.
    pub(crate) async fn shutdown(&self) -> Result<(), RmError> {
        let r = self.call(Cmd::Shutdown).await;
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = task {
            let _ = t.await;
        }
        match r {
            Err(RmError::Stopped(_)) => Ok(()),
            r => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each call reaches the actor as its command and comes back with the
    /// actor's answer; shutdown waits for the actor's end; calls after it
    /// say the resource manager stopped.
    #[tokio::test]
    async fn calls_become_commands_and_answers() {
        let (seen_tx, mut seen) = mpsc::unbounded_channel::<&'static str>();
        let h = ActorHandle::spawn("test", |mut cmds| async move {
            while let Some(cmd) = cmds.recv().await {
                match cmd {
                    Cmd::Request(req, reply) => {
                        let _ = seen_tx.send("request");
                        let _ = reply.send(if req.count > 0 {
                            Ok(())
                        } else {
                            Err(RmError::BadRequest("no containers".into()))
                        });
                    }
                    Cmd::Release(_, reply) => {
                        let _ = seen_tx.send("release");
                        let _ = reply.send(Ok(()));
                    }
                    Cmd::Capacity(reply) => {
                        let _ = reply.send(Ok(Capacity {
                            max_containers: 3,
                            running: 1,
                        }));
                    }
                    Cmd::Shutdown(reply) => {
                        let _ = seen_tx.send("shutdown");
                        let _ = reply.send(Ok(()));
                        return;
                    }
                }
            }
        });
        let req = |count| ContainerRequest {
            count,
            memory_mb: 1,
            cores: 1,
            hosts: vec![],
        };
        h.request(req(1)).await.unwrap();
        assert!(matches!(
            h.request(req(0)).await,
            Err(RmError::BadRequest(_))
        ));
        h.release(&"c1".to_string()).await.unwrap();
        let c = h.capacity().await.unwrap();
        assert_eq!((c.max_containers, c.running), (3, 1));
        h.shutdown().await.unwrap();
        let mut order = Vec::new();
        while let Ok(s) = seen.try_recv() {
            order.push(s);
        }
        assert_eq!(order, ["request", "request", "release", "shutdown"]);
        assert!(matches!(h.capacity().await, Err(RmError::Stopped("test"))));
        h.shutdown().await.unwrap();
    }
}
