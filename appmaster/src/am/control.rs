//! The AM's side of the control channel: accepting evaluators.
//!
//! The acceptor task owns the listening socket. Each connection is
//! authenticated (the evaluator must prove it knows the job secret) in its own
//! task, then handed to the event loop as an [`Event::Accepted`]; a refused
//! connection is reported as [`Event::Refused`] so the AM logs who tried.
//! Once accepted, a reader task per evaluator turns frames into
//! [`Event::Message`]s and ends with one [`Event::Disconnected`].

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::SplitStream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use cruise_container::protocol::{
    self, AmToEval, EvalToAm, EvaluatorId, Faults, FrameCodec, FrameOptions, Purpose, Secret,
};

use super::Event;

/// A control connection after the handshake.
pub type ControlFramed = Framed<TcpStream, FrameCodec<AmToEval, EvalToAm>>;

/// Settings of the acceptor.
#[derive(Clone)]
pub struct AcceptSettings {
    /// The job id evaluators must name.
    pub job_id: String,
    /// The job secret.
    pub secret: Secret,
    /// Frame options of the control channel.
    pub frames: FrameOptions,
    /// Handshake timeout.
    pub timeout: Duration,
}

/// Runs the acceptor until `cancel`.
pub async fn accept_loop(
    listener: TcpListener,
    settings: AcceptSettings,
    events: mpsc::Sender<Event>,
    tracker: TaskTracker,
    cancel: CancellationToken,
) {
    loop {
        let (stream, remote) = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => match a {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("control channel: accept failed: {e}");
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (s, ev, c) = (settings.clone(), events.clone(), cancel.clone());
        tracker.spawn(async move {
            let r = tokio::select! {
                _ = c.cancelled() => return,
                r = protocol::auth::accept::<_, AmToEval, EvalToAm>(
                    stream,
                    &s.secret,
                    &s.job_id,
                    s.frames,
                    s.timeout,
                    |id| match id.purpose {
                        Purpose::Control => Ok(()),
                        p => Err(format!("this is the AM's control port; {p:?} connections go to evaluators")),
                    },
                ) => r,
            };
            let event = match r {
                Ok((id, framed)) => Event::Accepted {
                    container: id.peer,
                    framed: Box::new(framed),
                    remote,
                },
                Err(e) => Event::Refused {
                    remote,
                    reason: e.to_string(),
                },
            };
            let _ = ev.send(event).await;
        });
    }
}

/// Reads one evaluator's frames into events until the connection ends.
pub async fn read_loop(
    eval: EvaluatorId,
    mut stream: SplitStream<ControlFramed>,
    events: mpsc::Sender<Event>,
    faults: Faults,
    cancel: CancellationToken,
) {
    let reason = loop {
        let frame = tokio::select! {
            _ = cancel.cancelled() => break "connection closed by the AM".to_string(),
            _ = faults.broken() => break "connection broken (injected fault)".to_string(),
            f = stream.next() => f,
        };
        match frame {
            Some(Ok(msg)) => {
                if events.send(Event::Message { eval, msg }).await.is_err() {
                    return;
                }
            }
            Some(Err(e)) => break format!("bad frame: {e}"),
            None => break "connection closed".to_string(),
        }
    };
    let _ = events.send(Event::Disconnected { eval, reason }).await;
}

/// The address evaluators should use to reach a listener bound to `bound`:
/// a wildcard address is replaced by loopback.
pub fn advertised(bound: SocketAddr) -> SocketAddr {
    if bound.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), bound.port())
    } else {
        bound
    }
}
