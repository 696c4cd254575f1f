//! The first frames of every connection: what it is for, and the HMAC
//! challenge that proves both ends know the job secret.

use serde::{Deserialize, Serialize};

/// A job secret proof is an HMAC-SHA256 tag.
pub type Nonce = [u8; 32];

/// What a connection is for, declared in its first frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Purpose {
    /// Evaluator → AM control channel.
    Control,
    /// Evaluator → evaluator store requests (pull, push, get, put, handover).
    Requests,
    /// Evaluator → evaluator bulk block transfer.
    Bulk,
}

/// The first frames of every connection. The connecting side says hello with a
/// nonce; the accepting side proves it knows the job secret and challenges;
/// the connecting side proves it too. Anything else is dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Handshake {
    /// Connecting side → accepting side.
    Hello {
        /// [`super::PROTOCOL_VERSION`] of the sender.
        protocol: u32,
        /// The job this connection belongs to.
        job_id: String,
        /// Who is connecting: a container id on the control channel, an
        /// evaluator id on the data plane.
        peer: String,
        /// What the connection is for.
        purpose: Purpose,
        /// Fresh random nonce.
        nonce: Nonce,
    },
    /// Accepting side → connecting side.
    Challenge {
        /// Fresh random nonce.
        nonce: Nonce,
        /// HMAC over both nonces, proving the accepting side knows the secret.
        proof: Vec<u8>,
    },
    /// Connecting side → accepting side.
    Proof {
        /// HMAC over both nonces and the hello, proving the connecting side knows the secret.
        proof: Vec<u8>,
    },
    /// Accepting side → connecting side: the connection may be used.
    Accepted,
    /// Accepting side → connecting side: refused; the connection closes.
    Rejected {
        /// Why.
        reason: String,
    },
}
