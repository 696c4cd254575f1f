//! The data plane's request connections: [`ToOwner`] carries a client's
//! [`PeerRequest`] to a block's owner, [`ToClient`] its [`PeerResponse`] or
//! [`RemoteError`].

use serde::{Deserialize, Serialize};

use super::{BlockId, EvaluatorId, Key, TableId, ValueBatch};

/// A store request to the owner of the blocks it touches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PeerRequest {
    /// Read values (pull). Answered by [`PeerResponse::Values`].
    Get {
        /// The table.
        table: TableId,
        /// The keys.
        keys: Vec<Key>,
    },
    /// Overwrite values. Answered by [`PeerResponse::Done`].
    Put {
        /// The table.
        table: TableId,
        /// The keys.
        keys: Vec<Key>,
        /// One value per key.
        values: ValueBatch,
    },
    /// Apply deltas with the table's update function (push). Answered by [`PeerResponse::Done`].
    Update {
        /// The table.
        table: TableId,
        /// The keys.
        keys: Vec<Key>,
        /// One delta per key.
        deltas: ValueBatch,
    },
    /// Migration: take ownership of a block and queue operations on it until
    /// its data arrives. Answered by [`PeerResponse::Done`].
    Handover {
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
        /// The move it belongs to.
        move_id: u64,
    },
    /// Bandwidth probe: answer with `bytes` of incompressible data. Answered
    /// by [`PeerResponse::Blob`].
    Probe {
        /// How many bytes.
        bytes: u64,
    },
    /// Migration failed after handover: the source asks to call the move
    /// off. If the block has not landed, the destination stops queueing,
    /// answers every operation it queued with a retryable error (none of them
    /// was applied) and forwards later ones to the source. If it has landed
    /// (the source lost the answer with its connection), the move stands.
    /// Idempotent. Answered by [`PeerResponse::HandoverOutcome`].
    AbortHandover {
        /// The table.
        table: TableId,
        /// The block.
        block: BlockId,
    },
}

/// The answer to a [`PeerRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PeerResponse {
    /// Values, in the order of the requested keys.
    Values(ValueBatch),
    /// Done.
    Done,
    /// Opaque bytes (the answer to a probe).
    Blob(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The answer to [`PeerRequest::AbortHandover`].
    HandoverOutcome {
        /// The destination had already installed the block: the move took
        /// place and the destination owns it. Otherwise the source does.
        installed: bool,
    },
}

/// An error answered to a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct RemoteError {
    /// Whether the request was not applied and may be sent again.
    pub retry: bool,
    /// What went wrong, with context.
    pub message: String,
    /// Set by this evaluator's data plane, never sent: the request was on
    /// its way to this peer when the connection was lost, so whether it was
    /// applied is unknown — unless the peer has left the job, whose blocks
    /// then come back from a checkpoint that cannot hold it (the request
    /// is then sent again to their new owner).
    #[serde(skip)]
    pub lost_at: Option<EvaluatorId>,
}

impl RemoteError {
    /// A permanent failure.
    pub fn fatal(message: impl Into<String>) -> Self {
        RemoteError {
            retry: false,
            message: message.into(),
            lost_at: None,
        }
    }

    /// The request was not applied; sending it again is safe.
    pub fn retry(message: impl Into<String>) -> Self {
        RemoteError {
            retry: true,
            message: message.into(),
            lost_at: None,
        }
    }

    /// The request was in flight to `peer` when its connection was lost.
    pub fn lost_at(peer: EvaluatorId, message: impl Into<String>) -> Self {
        RemoteError {
            retry: false,
            message: message.into(),
            lost_at: Some(peer),
        }
    }
}

/// Client → owner frames on a request connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToOwner {
    /// A request, answered by a response with the same id.
    Request {
        /// Id chosen by the client, unique on the connection.
        id: u64,
        /// The request.
        req: PeerRequest,
    },
    /// Answer to [`ToClient::GoAway`]: every request before this frame has
    /// been sent; no more will come on this connection.
    GoAwayAck,
}

/// Owner → client frames on a request connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToClient {
    /// The answer to a request.
    Response {
        /// The request's id.
        id: u64,
        /// The outcome.
        result: Result<PeerResponse, RemoteError>,
    },
    /// The owner is leaving: send nothing new, acknowledge with [`ToOwner::GoAwayAck`].
    GoAway,
}
