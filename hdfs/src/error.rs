//! The crate's error type: one enum for every backend, with the retryable /
//! permanent distinction the WebHDFS client needs and enough context (URI,
//! operation, endpoint, HTTP status) for a message a user can act on.

use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T, E = HdfsError> = std::result::Result<T, E>;

/// Everything that can go wrong in `cruise-hdfs`.
#[derive(Debug, thiserror::Error)]
pub enum HdfsError {
    /// A URI or path could not be parsed or names an unsupported scheme.
    #[error("invalid file-system URI {uri:?}: {reason}")]
    InvalidUri {
        /// The URI as given.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A local file-system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation (`status`, `read_range`, ...).
        op: &'static str,
        /// The local path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The path does not exist (local backend, or a WebHDFS
    /// `FileNotFoundException`).
    #[error("{op} {uri}: no such file or directory{detail}")]
    NotFound {
        /// The operation.
        op: &'static str,
        /// The URI or path that does not exist.
        uri: String,
        /// Extra detail (e.g. the endpoint and HTTP status), possibly empty.
        detail: String,
    },

    /// The target exists and the operation may not replace it.
    #[error("{op} {uri}: already exists{detail}")]
    AlreadyExists {
        /// The operation.
        op: &'static str,
        /// The URI or path that exists.
        uri: String,
        /// Extra detail, possibly empty.
        detail: String,
    },

    /// The operation is not valid for this path (e.g. reading a directory,
    /// a file in the way of `mkdirs`, deleting a non-empty directory without
    /// `recursive`, a failed rename).
    #[error("{op} {uri}: {reason}")]
    InvalidOperation {
        /// The operation.
        op: &'static str,
        /// The URI or path.
        uri: String,
        /// Why it is not valid.
        reason: String,
    },

    /// A WebHDFS server answered with an error (a `RemoteException` body, or an
    /// error status without one).
    #[error(
        "WebHDFS {op} {endpoint}: HTTP {status}: {exception}: {message}{}",
        if *retryable { " (retryable)" } else { "" }
    )]
    Remote {
        /// The WebHDFS operation (`GETFILESTATUS`, `OPEN`, ...).
        op: &'static str,
        /// The URL that answered (secrets redacted).
        endpoint: String,
        /// The HTTP status code.
        status: u16,
        /// The exception's short name (`FileNotFoundException`), or `HTTP` when
        /// the body carried none.
        exception: String,
        /// The exception's Java class name when the server gave one.
        java_class_name: Option<String>,
        /// The server's message.
        message: String,
        /// Whether trying again (possibly on another namenode) may succeed.
        retryable: bool,
        /// The wait the server asked for with `Retry-After` (seconds, or
        /// the whole seconds until the HTTP date it gave), if any.
        retry_after_secs: Option<u32>,
    },

    /// A request could not be sent or its response not received.
    #[error("WebHDFS {op} {endpoint}: request failed{}: {source}",
        if *retryable { " (retryable)" } else { "" })]
    Transport {
        /// The WebHDFS operation.
        op: &'static str,
        /// The URL (secrets redacted).
        endpoint: String,
        /// Whether the failure happened before the request reached the server
        /// or is otherwise safe to retry.
        retryable: bool,
        /// The underlying HTTP client error.
        #[source]
        source: reqwest::Error,
    },

    /// The response body could not be read to its end: the connection
    /// closed, failed or timed out part-way (a truncated body).
    #[error("WebHDFS {op} {endpoint}: HTTP {status}: the body ended after {received}{} bytes: {reason}{}",
        match expected { Some(n) => format!(" of {n}"), None => String::new() },
        if *retryable { " (retryable)" } else { "" })]
    BodyRead {
        /// The WebHDFS operation.
        op: &'static str,
        /// The URL that answered (secrets redacted).
        endpoint: String,
        /// The HTTP status code of the response.
        status: u16,
        /// Bytes of the body received before it failed.
        received: u64,
        /// The length the server announced (`Content-Length`), if any.
        expected: Option<u64>,
        /// Why the body ended (connection closed, timed out, ...).
        reason: String,
        /// Whether the request may be sent again.
        retryable: bool,
    },

    /// A response body is larger than what was asked for or than the limit
    /// on bodies of its kind; reading stopped at the limit.
    #[error("WebHDFS {op} {endpoint}: HTTP {status}: {what}")]
    TooLarge {
        /// The WebHDFS operation.
        op: &'static str,
        /// The URL that answered (secrets redacted).
        endpoint: String,
        /// The HTTP status code of the response.
        status: u16,
        /// What exceeded which limit.
        what: String,
    },

    /// Every attempt of an operation ran out of its time budget.
    #[error(
        "WebHDFS {op} {path}: gave up after {secs:.1} s ({attempts} attempts, deadline {deadline_secs:.0} s): {last}"
    )]
    DeadlineExceeded {
        /// The WebHDFS operation.
        op: &'static str,
        /// The file-system path.
        path: String,
        /// Attempts made.
        attempts: u32,
        /// Seconds spent.
        secs: f64,
        /// The operation's deadline in seconds.
        deadline_secs: f64,
        /// The last error, or what the attempt cut short was waiting for.
        last: String,
    },

    /// A server answered, but not in the shape the protocol defines.
    #[error("WebHDFS {op} {endpoint}: HTTP {status}: malformed response: {detail}")]
    MalformedResponse {
        /// The WebHDFS operation.
        op: &'static str,
        /// The URL that answered (secrets redacted).
        endpoint: String,
        /// The HTTP status code of the response.
        status: u16,
        /// What was wrong with it.
        detail: String,
    },

    /// Every attempt failed; `last` is the final error.
    #[error("WebHDFS {op} {path}: gave up after {attempts} attempts: {last}")]
    RetriesExhausted {
        /// The WebHDFS operation.
        op: &'static str,
        /// The file-system path.
        path: String,
        /// How many attempts were made.
        attempts: u32,
        /// The last error.
        #[source]
        last: Box<HdfsError>,
    },

    /// Hadoop configuration could not be read or lacks a needed key.
    #[error("Hadoop configuration {source_name}: {reason}")]
    Config {
        /// The file or key the problem is in.
        source_name: String,
        /// What is wrong.
        reason: String,
    },

    /// A record could not be located in a file (e.g. a split outside the file).
    #[error("{uri}: {reason}")]
    Split {
        /// The file.
        uri: String,
        /// What is wrong.
        reason: String,
    },
}

impl HdfsError {
    /// Whether retrying the same operation may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            HdfsError::Remote { retryable, .. }
            | HdfsError::Transport { retryable, .. }
            | HdfsError::BodyRead { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// The wait the server asked for before trying again (`Retry-After`).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            HdfsError::Remote {
                retry_after_secs, ..
            } => retry_after_secs.map(|s| std::time::Duration::from_secs(u64::from(s))),
            _ => None,
        }
    }

    /// Whether the error says that the path does not exist.
    pub fn is_not_found(&self) -> bool {
        match self {
            HdfsError::NotFound { .. } => true,
            HdfsError::Remote {
                status, exception, ..
            } => *status == 404 || exception == "FileNotFoundException",
            HdfsError::RetriesExhausted { last, .. } => last.is_not_found(),
            _ => false,
        }
    }

    /// Whether the error says that the target already exists.
    pub fn is_already_exists(&self) -> bool {
        match self {
            HdfsError::AlreadyExists { .. } => true,
            HdfsError::Remote { exception, .. } => exception == "FileAlreadyExistsException",
            HdfsError::RetriesExhausted { last, .. } => last.is_already_exists(),
            _ => false,
        }
    }

    /// The WebHDFS exception name (`StandbyException`, ...) when the server sent one.
    pub fn remote_exception(&self) -> Option<&str> {
        match self {
            HdfsError::Remote { exception, .. } => Some(exception),
            HdfsError::RetriesExhausted { last, .. } => last.remote_exception(),
            _ => None,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        match source.kind() {
            std::io::ErrorKind::NotFound => HdfsError::NotFound {
                op,
                uri: path.display().to_string(),
                detail: String::new(),
            },
            std::io::ErrorKind::AlreadyExists => HdfsError::AlreadyExists {
                op,
                uri: path.display().to_string(),
                detail: String::new(),
            },
            _ => HdfsError::Io { op, path, source },
        }
    }
}
