//! The authenticated handshake that opens every connection.
//!
//! Both sides know the job secret; neither sends it. The connecting side sends
//! `Hello` with a fresh nonce; the accepting side answers `Challenge` with its
//! own nonce and an HMAC-SHA256 tag over the hello and both nonces (proving it
//! knows the secret); the connecting side checks it and answers `Proof`, a tag
//! over the same data under a different label; the accepting side checks it in
//! constant time and answers `Accepted` or `Rejected`. The two labels keep one
//! side's tag from being replayed as the other's. Fresh nonces on both sides keep
//! a recorded handshake from being replayed.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::Framed;

use super::ProtocolError;
use super::codec::{FrameCodec, FrameOptions};
use super::messages::{Handshake, Nonce, PROTOCOL_VERSION, Purpose};

type HmacSha256 = Hmac<Sha256>;

/// A job secret (random bytes, exchanged as hex).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A fresh random 32-byte secret.
    pub fn generate() -> Self {
        let mut b = vec![0u8; 32];
        rand::rng().fill_bytes(&mut b);
        Secret(b)
    }

    /// Parses the hex form.
    pub fn from_hex(s: &str) -> Result<Self, ProtocolError> {
        let s = s.trim();
        if !s.len().is_multiple_of(2) || s.len() < 32 {
            return Err(ProtocolError::BadSecret(
                "the job secret must be at least 16 bytes of hex".into(),
            ));
        }
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map(Secret)
            .map_err(|_| ProtocolError::BadSecret("the job secret is not hex".into()))
    }

    /// The hex form.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn tag(&self, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        // HMAC accepts keys of any length.
        let mut mac = match HmacSha256::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable_hmac(),
        };
        mac.update(label);
        for p in parts {
            mac.update(&(p.len() as u64).to_le_bytes());
            mac.update(p);
        }
        mac
    }
}

#[cold]
fn unreachable_hmac() -> ! {
    // `Hmac::new_from_slice` only fails for fixed-key-size MACs; HMAC has none.
    panic!("HMAC-SHA256 rejected a key; HMAC takes keys of any length")
}

fn nonce() -> Nonce {
    let mut n = [0u8; 32];
    rand::rng().fill_bytes(&mut n);
    n
}

fn transcript<'a>(
    job_id: &'a str,
    peer: &'a str,
    purpose: Purpose,
    client: &'a Nonce,
    server: &'a Nonce,
) -> [Vec<u8>; 5] {
    [
        job_id.as_bytes().to_vec(),
        peer.as_bytes().to_vec(),
        vec![purpose as u8],
        client.to_vec(),
        server.to_vec(),
    ]
}

const SERVER_LABEL: &[u8] = b"cruise-rs/v1/accepting";
const CLIENT_LABEL: &[u8] = b"cruise-rs/v1/connecting";

/// Who connected, as established by [`accept`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The peer's self-declared name (container id or evaluator id).
    pub peer: String,
    /// What the connection is for.
    pub purpose: Purpose,
}

type HsFramed<S> = Framed<S, FrameCodec<Handshake, Handshake>>;

/// Handshake limits: handshake frames are small.
fn hs_opts(opts: FrameOptions) -> FrameOptions {
    FrameOptions {
        max_frame: 4096,
        ..opts
    }
}

async fn next_frame<S: AsyncRead + AsyncWrite + Unpin>(
    f: &mut HsFramed<S>,
) -> Result<Handshake, ProtocolError> {
    match f.next().await {
        Some(r) => r,
        None => Err(ProtocolError::Closed),
    }
}

/// Frames fed to a connection in one burst are written together, with one
/// system call, up to this many bytes. (The codec's default writes out
/// whatever is buffered once it holds 8 KiB, before taking the next frame:
/// a worker's push of a mini-batch then left in one write and the pull sent
/// with it in another, and the server woke up for each.)
pub const WRITE_BATCH_BYTES: usize = 1 << 20;

fn batched<S, C>(mut f: Framed<S, C>) -> Framed<S, C> {
    f.set_backpressure_boundary(WRITE_BATCH_BYTES);
    f
}

/// Runs the connecting side of the handshake and returns the stream framed for
/// the connection's messages.
pub async fn connect<S, Out, In>(
    stream: S,
    secret: &Secret,
    job_id: &str,
    peer: &str,
    purpose: Purpose,
    opts: FrameOptions,
    timeout: Duration,
) -> Result<Framed<S, FrameCodec<Out, In>>, ProtocolError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let run = async {
        let mut f: HsFramed<S> = Framed::new(stream, FrameCodec::new(hs_opts(opts)));
        let cn = nonce();
        f.send(Handshake::Hello {
            protocol: PROTOCOL_VERSION,
            job_id: job_id.to_string(),
            peer: peer.to_string(),
            purpose,
            nonce: cn,
        })
        .await?;
        let (sn, proof) = match next_frame(&mut f).await? {
            Handshake::Challenge { nonce, proof } => (nonce, proof),
            Handshake::Rejected { reason } => return Err(ProtocolError::Rejected(reason)),
            other => {
                return Err(ProtocolError::Handshake(format!(
                    "expected a challenge, got {}",
                    variant(&other)
                )));
            }
        };
        let t = transcript(job_id, peer, purpose, &cn, &sn);
        let parts: Vec<&[u8]> = t.iter().map(Vec::as_slice).collect();
        if secret
            .tag(SERVER_LABEL, &parts)
            .verify_slice(&proof)
            .is_err()
        {
            // Say why before leaving, so the other side can log it.
            let _ = f
                .send(Handshake::Rejected {
                    reason: "job secret mismatch: the connecting side could not verify the accepting side's proof".into(),
                })
                .await;
            return Err(ProtocolError::Handshake(
                "the other side does not know the job secret (its proof did not verify)".into(),
            ));
        }
        let mine = secret
            .tag(CLIENT_LABEL, &parts)
            .finalize()
            .into_bytes()
            .to_vec();
        f.send(Handshake::Proof { proof: mine }).await?;
        match next_frame(&mut f).await? {
            Handshake::Accepted => Ok(batched(f.map_codec(|_| FrameCodec::new(opts)))),
            Handshake::Rejected { reason } => Err(ProtocolError::Rejected(reason)),
            other => Err(ProtocolError::Handshake(format!(
                "expected acceptance, got {}",
                variant(&other)
            ))),
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| ProtocolError::Handshake(format!("no handshake within {timeout:?}")))?
}

/// Runs the accepting side of the handshake. `expect` checks the declared peer
/// and purpose (return an error text to refuse). On success returns who
/// connected and the stream framed for the connection's messages.
pub async fn accept<S, Out, In>(
    stream: S,
    secret: &Secret,
    job_id: &str,
    opts: FrameOptions,
    timeout: Duration,
    expect: impl FnOnce(&PeerIdentity) -> Result<(), String>,
) -> Result<(PeerIdentity, Framed<S, FrameCodec<Out, In>>), ProtocolError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let run = async {
        let mut f: HsFramed<S> = Framed::new(stream, FrameCodec::new(hs_opts(opts)));
        let (protocol, their_job, peer, purpose, cn) = match next_frame(&mut f).await? {
            Handshake::Hello {
                protocol,
                job_id,
                peer,
                purpose,
                nonce,
            } => (protocol, job_id, peer, purpose, nonce),
            other => {
                return Err(ProtocolError::Handshake(format!(
                    "expected hello, got {}",
                    variant(&other)
                )));
            }
        };
        let refuse = |f: HsFramed<S>, reason: String| async move {
            let mut f = f;
            // Best effort: the peer may already be gone.
            let _ = f
                .send(Handshake::Rejected {
                    reason: reason.clone(),
                })
                .await;
            Err(ProtocolError::Rejected(reason))
        };
        if protocol != PROTOCOL_VERSION {
            return refuse(
                f,
                format!("protocol version {protocol} is not supported (this side speaks {PROTOCOL_VERSION})"),
            )
            .await;
        }
        if their_job != job_id {
            return refuse(f, format!("wrong job: {their_job:?} (this is {job_id:?})")).await;
        }
        let sn = nonce();
        let t = transcript(job_id, &peer, purpose, &cn, &sn);
        let parts: Vec<&[u8]> = t.iter().map(Vec::as_slice).collect();
        let proof = secret
            .tag(SERVER_LABEL, &parts)
            .finalize()
            .into_bytes()
            .to_vec();
        f.send(Handshake::Challenge { nonce: sn, proof }).await?;
        let theirs = match next_frame(&mut f).await? {
            Handshake::Proof { proof } => proof,
            Handshake::Rejected { reason } => {
                return Err(ProtocolError::Rejected(format!(
                    "{peer:?} gave up: {reason}"
                )));
            }
            other => {
                return Err(ProtocolError::Handshake(format!(
                    "expected proof, got {}",
                    variant(&other)
                )));
            }
        };
        if secret
            .tag(CLIENT_LABEL, &parts)
            .verify_slice(&theirs)
            .is_err()
        {
            return refuse(
                f,
                format!("authentication failed for {peer:?}: wrong job secret"),
            )
            .await;
        }
        let id = PeerIdentity { peer, purpose };
        if let Err(reason) = expect(&id) {
            return refuse(f, reason).await;
        }
        f.send(Handshake::Accepted).await?;
        Ok((id, batched(f.map_codec(|_| FrameCodec::new(opts)))))
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| ProtocolError::Handshake(format!("no handshake within {timeout:?}")))?
}

fn variant(h: &Handshake) -> &'static str {
    match h {
        Handshake::Hello { .. } => "hello",
        Handshake::Challenge { .. } => "challenge",
        Handshake::Proof { .. } => "proof",
        Handshake::Accepted => "accepted",
        Handshake::Rejected { .. } => "rejected",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type F = Framed<tokio::io::DuplexStream, FrameCodec<u32, u32>>;

    async fn pair(
        client_secret: &Secret,
        server_secret: &Secret,
    ) -> (
        Result<F, ProtocolError>,
        Result<(PeerIdentity, F), ProtocolError>,
    ) {
        let (a, b) = tokio::io::duplex(1 << 16);
        let opts = FrameOptions::default();
        let t = Duration::from_secs(5);
        let (c, s) = tokio::join!(
            connect::<_, u32, u32>(
                a,
                client_secret,
                "job-1",
                "container_7",
                Purpose::Control,
                opts,
                t
            ),
            accept::<_, u32, u32>(b, server_secret, "job-1", opts, t, |_| Ok(()))
        );
        (c, s)
    }

    #[tokio::test]
    async fn same_secret_accepted_and_framing_continues() {
        let secret = Secret::generate();
        let (c, s) = pair(&secret, &secret).await;
        let mut c = c.unwrap();
        let (id, mut s) = s.unwrap();
        assert_eq!(id.peer, "container_7");
        assert_eq!(id.purpose, Purpose::Control);
        c.send(41).await.unwrap();
        assert_eq!(s.next().await.unwrap().unwrap(), 41);
    }

    #[tokio::test]
    async fn wrong_secret_rejected_on_both_sides() {
        let (c, s) = pair(&Secret::generate(), &Secret::generate()).await;
        let ce = c.unwrap_err();
        let se = s.unwrap_err();
        // The client notices first: the server's proof does not verify; it
        // tells the server why.
        assert!(ce.to_string().contains("job secret"), "{ce}");
        assert!(matches!(se, ProtocolError::Rejected(_)), "{se}");
        assert!(se.to_string().contains("secret mismatch"), "{se}");
    }

    #[tokio::test]
    async fn server_rejects_client_that_cannot_prove() {
        // A client that skips verification and sends a bogus proof.
        let secret = Secret::generate();
        let (a, b) = tokio::io::duplex(1 << 16);
        let opts = FrameOptions::default();
        let server = tokio::spawn(async move {
            accept::<_, u32, u32>(
                b,
                &secret,
                "job-1",
                opts,
                Duration::from_secs(5),
                |_| Ok(()),
            )
            .await
        });
        let mut f: HsFramed<_> = Framed::new(a, FrameCodec::new(opts));
        f.send(Handshake::Hello {
            protocol: PROTOCOL_VERSION,
            job_id: "job-1".into(),
            peer: "intruder".into(),
            purpose: Purpose::Control,
            nonce: [0; 32],
        })
        .await
        .unwrap();
        assert!(matches!(
            f.next().await.unwrap().unwrap(),
            Handshake::Challenge { .. }
        ));
        f.send(Handshake::Proof { proof: vec![0; 32] })
            .await
            .unwrap();
        match f.next().await.unwrap().unwrap() {
            Handshake::Rejected { reason } => {
                assert!(reason.contains("wrong job secret"), "{reason}")
            }
            other => panic!("expected rejection, got {other:?}"),
        }
        let err = server.await.unwrap().unwrap_err();
        assert!(err.to_string().contains("wrong job secret"), "{err}");
    }

    #[tokio::test]
    async fn wrong_job_rejected() {
        let secret = Secret::generate();
        let (a, b) = tokio::io::duplex(1 << 16);
        let opts = FrameOptions::default();
        let t = Duration::from_secs(5);
        let (c, s) = tokio::join!(
            connect::<_, u32, u32>(a, &secret, "job-A", "x", Purpose::Requests, opts, t),
            accept::<_, u32, u32>(b, &secret, "job-B", opts, t, |_| Ok(()))
        );
        assert!(c.unwrap_err().to_string().contains("wrong job"));
        assert!(s.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn silent_peer_times_out() {
        let secret = Secret::generate();
        let (_a, b) = tokio::io::duplex(1 << 16);
        let err = accept::<_, u32, u32>(
            b,
            &secret,
            "j",
            FrameOptions::default(),
            Duration::from_secs(3),
            |_| Ok(()),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("no handshake"), "{err}");
    }

    #[test]
    fn secret_hex_round_trip() {
        let s = Secret::generate();
        assert_eq!(Secret::from_hex(&s.to_hex()).unwrap(), s);
        assert!(Secret::from_hex("zz").is_err());
        assert!(Secret::from_hex("abcd").is_err());
    }
}
