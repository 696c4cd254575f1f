//! A minimal POSIX ustar writer: enough to pack the `cruise` binary and the
//! Hadoop client configuration into the tarball `cruise submit` uploads
//! (YARN unpacks `.tar` archives with `FileUtil.unTar`).
//!
//! Layout of each entry: a 512-byte header (name, octal mode, size and
//! mtime, checksum, `ustar\0` magic), the data padded to 512 bytes; the
//! archive ends with two zero blocks. Directories are implied by the paths
//! (`tar` creates them).

const BLOCK: usize = 512;

/// Errors of the tar writer.
#[derive(Debug, thiserror::Error)]
pub enum TarError {
    /// A path does not fit the ustar name fields or is not relative.
    #[error(
        "cannot store {0:?} in a tar archive: paths must be relative, without '..', at most 100 bytes"
    )]
    BadPath(String),
    /// A file is too large for the ustar size field (8 GiB).
    #[error("{0:?} is too large for a tar archive")]
    TooLarge(String),
}

/// One file of an archive.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    /// Relative path inside the archive.
    pub path: &'a str,
    /// Permission bits (e.g. `0o755`).
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: u64,
    /// Contents.
    pub data: &'a [u8],
}

fn octal(field: &mut [u8], value: u64) {
    // Digits, then NUL: the field's last byte is the terminator.
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    field[..digits].copy_from_slice(text.as_bytes());
    field[digits] = 0;
}

fn header(e: &Entry<'_>) -> Result<[u8; BLOCK], TarError> {
    let p = e.path;
    if p.is_empty()
        || p.len() > 100
        || p.starts_with('/')
        || p.split('/').any(|s| s == ".." || s.is_empty())
    {
        return Err(TarError::BadPath(p.to_string()));
    }
    let size = e.data.len() as u64;
    if size >= 8 << 30 {
        return Err(TarError::TooLarge(p.to_string()));
    }
    let mut h = [0u8; BLOCK];
    h[..p.len()].copy_from_slice(p.as_bytes());
    octal(&mut h[100..108], u64::from(e.mode & 0o7777));
    octal(&mut h[108..116], 0); // uid
    octal(&mut h[116..124], 0); // gid
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], e.mtime);
    h[156] = b'0'; // regular file
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    // The checksum is computed with its own field as spaces.
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    let text = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(text.as_bytes());
    Ok(h)
}

/// Packs `entries` into an uncompressed tar archive.
pub fn build(entries: &[Entry<'_>]) -> Result<Vec<u8>, TarError> {
    let total: usize = entries
        .iter()
        .map(|e| BLOCK + e.data.len().div_ceil(BLOCK) * BLOCK)
        .sum::<usize>()
        + 2 * BLOCK;
    let mut out = Vec::with_capacity(total);
    for e in entries {
        out.extend_from_slice(&header(e)?);
        out.extend_from_slice(e.data);
        let pad = e.data.len().div_ceil(BLOCK) * BLOCK - e.data.len();
        out.resize(out.len() + pad, 0);
    }
    out.resize(out.len() + 2 * BLOCK, 0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The system's `tar` reads what we write: names, contents, modes.
    #[test]
    fn system_tar_extracts_it() {
        let dir = tempfile::tempdir().unwrap();
        let big: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let archive = build(&[
            Entry {
                path: "cruise",
                mode: 0o755,
                mtime: 1_700_000_000,
                data: &big,
            },
            Entry {
                path: "hadoop-conf/core-site.xml",
                mode: 0o644,
                mtime: 1_700_000_000,
                data: b"<configuration/>\n",
            },
            Entry {
                path: "empty",
                mode: 0o600,
                mtime: 0,
                data: b"",
            },
        ])
        .unwrap();
        assert_eq!(archive.len() % BLOCK, 0);
        let tar = dir.path().join("x.tar");
        std::fs::write(&tar, &archive).unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        let st = std::process::Command::new("tar")
            .arg("-xf")
            .arg(&tar)
            .arg("-C")
            .arg(&out)
            .status()
            .unwrap();
        assert!(st.success());
        assert_eq!(std::fs::read(out.join("cruise")).unwrap(), big);
        assert_eq!(
            std::fs::read(out.join("hadoop-conf/core-site.xml")).unwrap(),
            b"<configuration/>\n"
        );
        assert_eq!(std::fs::read(out.join("empty")).unwrap(), b"");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(out.join("cruise"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o100, 0o100, "executable: {mode:o}");
        // `tar -t` lists exactly our entries.
        let list = std::process::Command::new("tar")
            .arg("-tf")
            .arg(&tar)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(list.stdout).unwrap(),
            "cruise\nhadoop-conf/core-site.xml\nempty\n"
        );
    }

    #[test]
    fn bad_paths_refused() {
        for p in ["", "/abs", "a/../b", "a//b", &"x".repeat(101)] {
            let e = Entry {
                path: p,
                mode: 0o644,
                mtime: 0,
                data: b"",
            };
            assert!(build(&[e]).is_err(), "{p:?}");
        }
    }
}
