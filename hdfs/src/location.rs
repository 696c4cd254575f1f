//! Parsing of the URIs and paths that name input and output files.
//!
//! Accepted forms:
//! - `hdfs://<nameservice-or-host[:port]>/path` — resolved to namenode HTTP
//!   addresses through the Hadoop configuration ([`crate::HadoopConf`]);
//!   `hdfs:///path` uses the authority of `fs.defaultFS`.
//! - `webhdfs://<host[:port]>/path` — WebHDFS at that address (port 9870 by
//!   default), or a nameservice from the configuration.
//! - `file:///path` (or `file://localhost/path`) and plain paths — local files.
//!
//! Paths are taken as written (no percent-decoding); the WebHDFS client
//! percent-encodes them when it builds request URLs.

use std::fmt;
use std::path::PathBuf;

use crate::error::{HdfsError, Result};

/// Which kind of file system a URI names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `hdfs://`: an HDFS namenode or nameservice reached over WebHDFS.
    Hdfs,
    /// `webhdfs://`: a WebHDFS HTTP address.
    WebHdfs,
}

impl Scheme {
    /// The scheme as written in a URI.
    pub fn as_str(&self) -> &'static str {
        match self {
            Scheme::Hdfs => "hdfs",
            Scheme::WebHdfs => "webhdfs",
        }
    }
}

/// A parsed file location.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Location {
    /// A file on this machine.
    Local {
        /// The local path.
        path: PathBuf,
    },
    /// A file in a remote HDFS reached over WebHDFS.
    Remote {
        /// `hdfs` or `webhdfs`.
        scheme: Scheme,
        /// `host`, `host:port` or a nameservice name; empty for `hdfs:///path`.
        authority: String,
        /// The absolute path inside the file system, always starting with `/`.
        path: String,
    },
}

impl Location {
    /// Parses a URI or plain path.
    pub fn parse(uri: &str) -> Result<Location> {
        let invalid = |reason: &str| HdfsError::InvalidUri {
            uri: uri.to_string(),
            reason: reason.to_string(),
        };
        if uri.is_empty() {
            return Err(invalid("empty path"));
        }
        let Some((scheme, rest)) = split_scheme(uri) else {
            // A plain path: local.
            return Ok(Location::Local {
                path: PathBuf::from(uri),
            });
        };
        let Some(rest) = rest.strip_prefix("//") else {
            return Err(invalid(&format!(
                "expected {scheme}://authority/path (missing '//')"
            )));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.contains(['?', '#', '@']) || path.contains(['?', '#']) {
            return Err(invalid(
                "query strings, fragments and user info are not supported",
            ));
        }
        match scheme.to_ascii_lowercase().as_str() {
            "file" => {
                if !authority.is_empty() && authority != "localhost" {
                    return Err(invalid(
                        "file:// URIs must name a local path (file:///path), not a host",
                    ));
                }
                Ok(Location::Local {
                    path: PathBuf::from(path),
                })
            }
            "hdfs" | "webhdfs" => {
                let scheme = if scheme.eq_ignore_ascii_case("hdfs") {
                    Scheme::Hdfs
                } else {
                    Scheme::WebHdfs
                };
                if authority.is_empty() && scheme == Scheme::WebHdfs {
                    return Err(invalid(
                        "webhdfs:// URIs need a host (webhdfs://host:port/path)",
                    ));
                }
                if let Some((host, port)) = authority.rsplit_once(':') {
                    if host.is_empty() {
                        return Err(invalid("empty host"));
                    }
                    if port.parse::<u16>().is_err() {
                        return Err(invalid(&format!("invalid port {port:?}")));
                    }
                }
                Ok(Location::Remote {
                    scheme,
                    authority: authority.to_string(),
                    path: normalize_remote_path(path),
                })
            }
            "swebhdfs" => Err(invalid(
                "swebhdfs:// (WebHDFS over TLS) is not supported by this build; use webhdfs:// or hdfs://",
            )),
            other => Err(invalid(&format!(
                "unsupported scheme {other:?} (expected hdfs://, webhdfs://, file:// or a plain path)"
            ))),
        }
    }

    /// The location of `name` inside this directory location.
    pub fn child(&self, name: &str) -> Location {
        match self {
            Location::Local { path } => Location::Local {
                path: path.join(name),
            },
            Location::Remote {
                scheme,
                authority,
                path,
            } => {
                let mut p = path.trim_end_matches('/').to_string();
                p.push('/');
                p.push_str(name);
                Location::Remote {
                    scheme: scheme.clone(),
                    authority: authority.clone(),
                    path: p,
                }
            }
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local { path } => write!(f, "{}", path.display()),
            Location::Remote {
                scheme,
                authority,
                path,
            } => write!(f, "{}://{}{}", scheme.as_str(), authority, path),
        }
    }
}

/// Splits `scheme:rest` when the prefix is a URI scheme (letters, digits,
/// `+-.`, starting with a letter, at least two characters so that Windows-like
/// drive letters are not mistaken for schemes).
fn split_scheme(uri: &str) -> Option<(&str, &str)> {
    let colon = uri.find(':')?;
    let scheme = &uri[..colon];
    let mut chars = scheme.chars();
    let first = chars.next()?;
    if scheme.len() < 2
        || !first.is_ascii_alphabetic()
        || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return None;
    }
    Some((scheme, &uri[colon + 1..]))
}

/// Collapses repeated slashes and drops a trailing slash (except for `/`).
fn normalize_remote_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len() + 1);
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        out.push('/');
        out.push_str(seg);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_forms() {
        assert_eq!(
            Location::parse("hdfs://mycluster/data/x.txt").unwrap(),
            Location::Remote {
                scheme: Scheme::Hdfs,
                authority: "mycluster".into(),
                path: "/data/x.txt".into()
            }
        );
        assert_eq!(
            Location::parse("webhdfs://127.0.0.1:9870//a//b/").unwrap(),
            Location::Remote {
                scheme: Scheme::WebHdfs,
                authority: "127.0.0.1:9870".into(),
                path: "/a/b".into()
            }
        );
        assert_eq!(
            Location::parse("hdfs:///x").unwrap(),
            Location::Remote {
                scheme: Scheme::Hdfs,
                authority: "".into(),
                path: "/x".into()
            }
        );
        assert_eq!(
            Location::parse("file:///tmp/a").unwrap(),
            Location::Local {
                path: "/tmp/a".into()
            }
        );
        assert_eq!(
            Location::parse("rel/path.txt").unwrap(),
            Location::Local {
                path: "rel/path.txt".into()
            }
        );
        assert_eq!(
            Location::parse("/abs/p:x").unwrap(),
            Location::Local {
                path: "/abs/p:x".into()
            }
        );
        assert_eq!(
            Location::parse("webhdfs://h:1/").unwrap().to_string(),
            "webhdfs://h:1/"
        );
        assert_eq!(
            Location::parse("hdfs://ns/d")
                .unwrap()
                .child("f")
                .to_string(),
            "hdfs://ns/d/f"
        );
    }

    #[test]
    fn rejects_bad_uris_naming_them() {
        for bad in [
            "s3://bucket/key",
            "hdfs:/x",
            "webhdfs:///x",
            "hdfs://h:notaport/x",
            "file://otherhost/x",
            "swebhdfs://h:1/x",
            "",
        ] {
            let err = Location::parse(bad).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(&format!("{bad:?}")), "{msg}");
        }
    }
}
