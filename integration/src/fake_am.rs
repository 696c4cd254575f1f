//! A scriptable fake AM: accepts one evaluator's control connection over the
//! real handshake and lets a test send [`AmToEval`] messages and wait for
//! [`EvalToAm`] answers. Used to drive a real evaluator process through a
//! sequence of tasks (e.g. worker, then server) and watch it from outside.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Framed;

use cruise_container::evaluator::{ENV_AM_ADDR, ENV_CONTAINER_ID, ENV_JOB_ID, ENV_JOB_SECRET};
use cruise_container::protocol::{
    self, AmToEval, EvalToAm, FrameCodec, FrameOptions, PeerIdentity, Secret,
};

/// The fake AM's listener and credentials.
pub struct FakeAm {
    listener: TcpListener,
    /// The job id evaluators must name.
    pub job_id: String,
    /// The job secret.
    pub secret: Secret,
}

/// One accepted evaluator connection.
pub struct Conn {
    /// Who connected.
    pub identity: PeerIdentity,
    framed: Framed<TcpStream, FrameCodec<AmToEval, EvalToAm>>,
}

impl FakeAm {
    /// Listens on a loopback port.
    pub async fn bind() -> anyhow::Result<FakeAm> {
        Ok(FakeAm {
            listener: TcpListener::bind("127.0.0.1:0").await?,
            job_id: "job_fake_0001".into(),
            secret: Secret::generate(),
        })
    }

    /// The environment an evaluator needs to reach this AM, with `secret`.
    pub fn env_with_secret(
        &self,
        container: &str,
        secret: &Secret,
    ) -> anyhow::Result<BTreeMap<String, String>> {
        Ok(BTreeMap::from([
            (
                ENV_AM_ADDR.to_string(),
                self.listener.local_addr()?.to_string(),
            ),
            (ENV_JOB_ID.to_string(), self.job_id.clone()),
            (ENV_JOB_SECRET.to_string(), secret.to_hex()),
            (ENV_CONTAINER_ID.to_string(), container.to_string()),
        ]))
    }

    /// The environment an evaluator needs to reach this AM.
    pub fn env(&self, container: &str) -> anyhow::Result<BTreeMap<String, String>> {
        self.env_with_secret(container, &self.secret)
    }

    /// Accepts one connection and runs the handshake.
    pub async fn accept(&self, timeout: Duration) -> anyhow::Result<Conn> {
        let (stream, _) = tokio::time::timeout(timeout, self.listener.accept())
            .await
            .context("no evaluator connected")??;
        let (identity, framed) = protocol::auth::accept::<_, AmToEval, EvalToAm>(
            stream,
            &self.secret,
            &self.job_id,
            FrameOptions::default(),
            timeout,
            |_| Ok(()),
        )
        .await?;
        Ok(Conn { identity, framed })
    }
}

impl Conn {
    /// Sends a message.
    pub async fn send(&mut self, m: AmToEval) -> anyhow::Result<()> {
        self.framed
            .send(m)
            .await
            .context("sending to the evaluator")
    }

    /// Waits for a message for which `pick` returns `Some`, skipping others
    /// (heartbeats, reports). Answers the evaluator's heartbeats meanwhile.
    pub async fn expect<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        mut pick: impl FnMut(&EvalToAm) -> Option<T>,
    ) -> anyhow::Result<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let frame = tokio::time::timeout(left, self.framed.next())
                .await
                .with_context(|| format!("timed out waiting for {what}"))?;
            match frame {
                Some(Ok(m)) => {
                    if matches!(m, EvalToAm::Heartbeat { .. }) {
                        self.send(AmToEval::Heartbeat).await?;
                    }
                    if let EvalToAm::Fatal { error } = &m {
                        bail!("evaluator failed while waiting for {what}: {error}");
                    }
                    if let Some(v) = pick(&m) {
                        return Ok(v);
                    }
                }
                Some(Err(e)) => bail!("control channel error waiting for {what}: {e}"),
                None => bail!("the evaluator closed the connection while waiting for {what}"),
            }
        }
    }
}
