//! Resource localization, as a NodeManager's `FSDownload` does it: for each
//! local resource of an AM container spec, check the source's length and
//! modification time against the `size` and `timestamp` given at submission,
//! copy it into the container's working directory under its key, and unpack
//! archives.
//!
//! Sources:
//! - `hdfs://host:port/path` and `webhdfs://host:port/path`: WebHDFS over plain
//!   HTTP at `http://host:port` (or at `--webhdfs URL` when given):
//!   `GETFILESTATUS` for length and modificationTime, then `OPEN` following
//!   redirects (NameNode 307 to DataNode).
//! - `http://host:port/webhdfs/v1/path`: the same, with the WebHDFS address
//!   spelled out.
//! - `file:///path`: a local file (length and mtime from the file system).

use std::path::Path;

use super::common::{iso8601_ms, now_ms};
use super::state::LocalResource;

/// A fetched source: its bytes plus the length and modification time the
/// source file system reports.
struct Fetched {
    bytes: Vec<u8>,
    length: i64,
    mtime_ms: i64,
}

/// Localize all resources into `cwd`. On failure the error is the container
/// diagnostics YARN would show.
pub(crate) async fn localize(
    http: &reqwest::Client,
    webhdfs_override: Option<&str>,
    user: &str,
    resources: &[LocalResource],
    cwd: &Path,
) -> Result<(), String> {
    for r in resources {
        localize_one(http, webhdfs_override, user, r, cwd)
            .await
            .map_err(|e| format!("Failed to localize resource {} ({}): {e}", r.key, r.url))?;
    }
    Ok(())
}

async fn localize_one(
    http: &reqwest::Client,
    webhdfs_override: Option<&str>,
    user: &str,
    r: &LocalResource,
    cwd: &Path,
) -> Result<(), String> {
    if r.key.is_empty() || r.key.contains('/') || r.key == "." || r.key == ".." {
        return Err(format!("invalid local resource name {:?}", r.key));
    }
    let fetched = fetch(http, webhdfs_override, user, &r.url).await?;
    if r.verify && fetched.mtime_ms != r.timestamp {
        return Err(format!(
            "Resource {} changed on src filesystem - expected: \"{}\", was: \"{}\", current time: \"{}\"",
            r.url,
            iso8601_ms(r.timestamp),
            iso8601_ms(fetched.mtime_ms),
            iso8601_ms(now_ms() as i64)
        ));
    }
    if fetched.bytes.len() as i64 != fetched.length || (r.verify && fetched.length != r.size) {
        return Err(format!(
            "Resource {} changed on src filesystem - expected size: {}, was: {} (downloaded {} bytes)",
            r.url,
            r.size,
            fetched.length,
            fetched.bytes.len()
        ));
    }
    let dest = cwd.join(&r.key);
    match r.kind.as_str() {
        "FILE" => {
            std::fs::write(&dest, &fetched.bytes)
                .map_err(|e| format!("writing {}: {e}", dest.display()))?;
            // FSDownload: public files r-x for all, private ones for the owner.
            set_mode(
                &dest,
                if r.visibility == "PUBLIC" {
                    0o555
                } else {
                    0o500
                },
            )?;
        }
        "ARCHIVE" | "PATTERN" => {
            let cache = cwd.join(format!(".{}.download", r.key));
            std::fs::write(&cache, &fetched.bytes)
                .map_err(|e| format!("writing {}: {e}", cache.display()))?;
            let res = unpack(&cache, &dest, &r.url).await;
            let _ = std::fs::remove_file(&cache);
            res?;
        }
        other => {
            return Err(format!(
                "unknown local resource type {other:?} (expected FILE, ARCHIVE or PATTERN)"
            ));
        }
    }
    Ok(())
}

fn set_mode(p: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("chmod {}: {e}", p.display()))
}

/// Unpack an archive the way FSDownload does (by the source's extension).
async fn unpack(archive: &Path, dest: &Path, url: &str) -> Result<(), String> {
    std::fs::create_dir_all(dest).map_err(|e| format!("creating {}: {e}", dest.display()))?;
    let lower = url.to_ascii_lowercase();
    let mut cmd = if lower.ends_with(".zip") || lower.ends_with(".jar") {
        let mut c = tokio::process::Command::new("unzip");
        c.arg("-q").arg(archive).arg("-d").arg(dest);
        c
    } else if [".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz"]
        .iter()
        .any(|s| lower.ends_with(s))
    {
        let mut c = tokio::process::Command::new("tar");
        c.arg("-xf").arg(archive).arg("-C").arg(dest);
        c
    } else {
        return Err(format!(
            "cannot unpack {url}: ARCHIVE resources must end in .zip, .jar, .tar, .tar.gz, .tgz, .tar.bz2 or .tar.xz"
        ));
    };
    let out = cmd
        .output()
        .await
        .map_err(|e| format!("running unpacker for {url}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "unpacking {url} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Split `scheme://authority/path`.
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let (auth, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    Some((scheme, auth, path))
}

async fn fetch(
    http: &reqwest::Client,
    webhdfs_override: Option<&str>,
    user: &str,
    url: &str,
) -> Result<Fetched, String> {
    let (scheme, auth, path) = split_url(url).ok_or_else(|| format!("not a URL: {url:?}"))?;
    match scheme {
        "file" => {
            let p = Path::new(path);
            let meta =
                std::fs::metadata(p).map_err(|e| format!("File {path} does not exist ({e})"))?;
            let mtime_ms = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            let bytes = std::fs::read(p).map_err(|e| format!("reading {path}: {e}"))?;
            Ok(Fetched {
                length: meta.len() as i64,
                mtime_ms,
                bytes,
            })
        }
        "hdfs" | "webhdfs" | "http" => {
            let (base, hdfs_path) = if scheme == "http" {
                let p = path.strip_prefix("/webhdfs/v1").ok_or_else(|| {
                    format!("http resource {url} is not a WebHDFS URL (/webhdfs/v1/...)")
                })?;
                (format!("http://{auth}"), p.to_string())
            } else {
                let base = match webhdfs_override {
                    Some(b) => b.trim_end_matches('/').to_string(),
                    None if auth.is_empty() => {
                        return Err(format!(
                            "{url} names no host; start cruise-sim yarn with --webhdfs http://HOST:PORT"
                        ));
                    }
                    None => format!("http://{auth}"),
                };
                (base, path.to_string())
            };
            let path_q = hdfs_path.split('?').next().unwrap_or("/");
            let status_url = format!("{base}/webhdfs/v1{path_q}?op=GETFILESTATUS&user.name={user}");
            let resp = http
                .get(&status_url)
                .send()
                .await
                .map_err(|e| format!("GET {status_url}: {e}"))?;
            let code = resp.status();
            let body = resp
                .text()
                .await
                .map_err(|e| format!("GET {status_url}: reading body: {e}"))?;
            if !code.is_success() {
                return Err(format!("GET {status_url} answered {code}: {}", body.trim()));
            }
            let v: serde_json::Value = serde_json::from_str(&body)
                .map_err(|e| format!("GET {status_url}: bad FileStatus JSON: {e}"))?;
            let fs = &v["FileStatus"];
            let (Some(length), Some(mtime_ms)) =
                (fs["length"].as_i64(), fs["modificationTime"].as_i64())
            else {
                return Err(format!(
                    "GET {status_url}: FileStatus lacks length/modificationTime: {body}"
                ));
            };
            if fs["type"].as_str() == Some("DIRECTORY") {
                return Err(format!(
                    "{url} is a directory; cruise-sim localizes files only"
                ));
            }
            let open_url = format!("{base}/webhdfs/v1{path_q}?op=OPEN&user.name={user}");
            let resp = http
                .get(&open_url)
                .send()
                .await
                .map_err(|e| format!("GET {open_url}: {e}"))?;
            let code = resp.status();
            let bytes = resp
                .bytes()
                .await
                .map_err(|e| format!("GET {open_url}: reading body: {e}"))?;
            if !code.is_success() {
                return Err(format!(
                    "GET {open_url} answered {code}: {}",
                    String::from_utf8_lossy(&bytes).trim()
                ));
            }
            Ok(Fetched {
                bytes: bytes.to_vec(),
                length,
                mtime_ms,
            })
        }
        other => Err(format!(
            "unsupported resource scheme {other:?} in {url} (use hdfs, webhdfs, http or file)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_url_parts() {
        assert_eq!(
            split_url("hdfs://nn:8020/a/b"),
            Some(("hdfs", "nn:8020", "/a/b"))
        );
        assert_eq!(split_url("file:///tmp/x"), Some(("file", "", "/tmp/x")));
        assert_eq!(split_url("nope"), None);
    }

    #[tokio::test]
    async fn file_resource_checks_timestamp_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.txt");
        std::fs::write(&src, b"hello").unwrap();
        let mtime = std::fs::metadata(&src)
            .unwrap()
            .modified()
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let cwd = dir.path().join("cwd");
        std::fs::create_dir_all(&cwd).unwrap();
        let http = reqwest::Client::new();
        let mut r = LocalResource {
            key: "greeting".into(),
            url: format!("file://{}", src.display()),
            kind: "FILE".into(),
            visibility: "APPLICATION".into(),
            size: 5,
            timestamp: mtime,
            verify: true,
        };
        localize(&http, None, "alice", std::slice::from_ref(&r), &cwd)
            .await
            .unwrap();
        assert_eq!(std::fs::read(cwd.join("greeting")).unwrap(), b"hello");

        r.key = "stale".into();
        r.timestamp = mtime - 1000;
        let err = localize(&http, None, "alice", std::slice::from_ref(&r), &cwd)
            .await
            .unwrap_err();
        assert!(err.contains("changed on src filesystem"), "{err}");

        r.timestamp = mtime;
        r.size = 6;
        let err = localize(&http, None, "alice", &[r], &cwd)
            .await
            .unwrap_err();
        assert!(err.contains("expected size: 6"), "{err}");
    }

    #[tokio::test]
    async fn archives_are_unpacked_under_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let content = dir.path().join("content");
        std::fs::create_dir_all(content.join("bin")).unwrap();
        std::fs::write(content.join("bin/tool"), b"#!/bin/sh\necho tool\n").unwrap();
        let tgz = dir.path().join("pkg.tar.gz");
        let st = std::process::Command::new("tar")
            .arg("-czf")
            .arg(&tgz)
            .arg("-C")
            .arg(&content)
            .arg("bin")
            .status()
            .unwrap();
        assert!(st.success());
        let mtime_of = |p: &std::path::Path| {
            std::fs::metadata(p)
                .unwrap()
                .modified()
                .unwrap()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64
        };
        let len = std::fs::metadata(&tgz).unwrap().len() as i64;
        let cwd = dir.path().join("cwd");
        std::fs::create_dir_all(&cwd).unwrap();
        let r = LocalResource {
            key: "pkg".into(),
            url: format!("file://{}", tgz.display()),
            kind: "ARCHIVE".into(),
            visibility: "PUBLIC".into(),
            size: len,
            timestamp: mtime_of(&tgz),
            verify: true,
        };
        let http = reqwest::Client::new();
        localize(&http, None, "alice", std::slice::from_ref(&r), &cwd)
            .await
            .unwrap();
        assert_eq!(
            std::fs::read(cwd.join("pkg/bin/tool")).unwrap(),
            b"#!/bin/sh\necho tool\n"
        );
        // An archive type the NodeManager would not know how to unpack.
        let rar = dir.path().join("pkg.rar");
        std::fs::copy(&tgz, &rar).unwrap();
        let bad = LocalResource {
            key: "odd".into(),
            url: format!("file://{}", rar.display()),
            timestamp: mtime_of(&rar),
            ..r
        };
        let err = localize(&http, None, "alice", &[bad], &cwd)
            .await
            .unwrap_err();
        assert!(err.contains("cannot unpack"), "{err}");
    }
}
