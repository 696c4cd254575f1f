//! Every benchmark binary explains itself on `--help` (and exits 0) instead of
//! reading the flag as a bad positional argument.

use std::process::Command;

#[test]
fn every_benchmark_prints_its_usage_on_help() {
    let benches = [
        ("bench-checkpoint", env!("CARGO_BIN_EXE_bench-checkpoint")),
        ("bench-control", env!("CARGO_BIN_EXE_bench-control")),
        ("bench-dataplane", env!("CARGO_BIN_EXE_bench-dataplane")),
        ("bench-mlr", env!("CARGO_BIN_EXE_bench-mlr")),
        ("bench-optimizer", env!("CARGO_BIN_EXE_bench-optimizer")),
        ("bench-reconfig", env!("CARGO_BIN_EXE_bench-reconfig")),
        ("bench-rss", env!("CARGO_BIN_EXE_bench-rss")),
        ("bench-webhdfs", env!("CARGO_BIN_EXE_bench-webhdfs")),
    ];
    for (name, exe) in benches {
        for flag in ["--help", "-h"] {
            let out = Command::new(exe)
                .arg(flag)
                .output()
                .unwrap_or_else(|e| panic!("running {name} {flag}: {e}"));
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{name} {flag} exited {:?}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                stdout.starts_with(&format!("Usage: {name}")),
                "{name} {flag} printed {stdout:?}"
            );
        }
    }
}
