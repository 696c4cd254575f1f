//! The wire protocol shared by the AM and evaluators.
//!
//! - [`codec`]: the frame layout (length-delimited, optional lz4) and its codec.
//! - [`auth`]: the HMAC challenge handshake that opens every connection.
//! - [`frames`]: the request connections' reader and writer, which send
//!   large values apart from their message, with no copy of their own.
//! - [`messages`]: one message enum per direction per channel.
//! - [`transport`]: the writer task that owns a connection's send half, and
//!   the fault hooks (delay, break) that tests use to disturb a connection.

pub mod auth;
pub mod codec;
pub mod frames;
pub mod messages;
pub mod transport;

pub use auth::{PeerIdentity, Secret};
pub use codec::{FrameCodec, FrameOptions};
pub use frames::{FrameReader, FrameWriter, Placement};
pub use messages::*;
pub use transport::{Faults, spawn_writer};

/// An error on a connection. Any of these closes the connection that produced
/// it; none of them takes the process down.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The socket failed.
    #[error("connection I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A frame larger than the connection allows.
    #[error("frame of {size} bytes exceeds the maximum of {max} bytes")]
    FrameTooLarge {
        /// Size announced or produced.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// A frame that is not a valid message.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// A message that could not be encoded.
    #[error("cannot encode message: {0}")]
    Encode(String),
    /// The handshake went wrong.
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// The other side refused the connection.
    #[error("connection refused by peer: {0}")]
    Rejected(String),
    /// The job secret given is unusable.
    #[error("bad job secret: {0}")]
    BadSecret(String),
    /// The other side closed the connection.
    #[error("connection closed by peer")]
    Closed,
}
