//! Solver cost versus cluster size: the homogeneous closed form up to N = 10,000, the
//! full [`solve`] on a uniform cluster (closed form plus partition) up to N = 1,000, and
//! the heterogeneous search up to N = 64 (deterministic pseudo-random containers).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use cruise_optimizer::{
    ContainerMetrics, CostModel, Job, Role, Snapshot, Uniform, solve, solve_homogeneous,
};

fn job(n: usize) -> Job {
    Job::new(
        1_000_000,
        1_000,
        4.0e6,
        (4 * n) as u32,
        (2 * n) as u32,
        100.0,
    )
}

/// `n` identical containers.
fn uniform(n: usize, u: &Uniform) -> Snapshot {
    let containers = (0..n)
        .map(|i| ContainerMetrics {
            id: format!("c{i:04}"),
            role: Role::Idle,
            compute_secs_per_record: Some(u.compute_secs_per_record),
            cpu_speed: None,
            bandwidth_bytes_per_sec: u.bandwidth_bytes_per_sec,
            server_secs_per_byte: Some(u.server_secs_per_byte),
            request_secs_per_server: None,
            server_secs_per_mini_batch: None,
            input_blocks: 0,
            model_blocks: 0,
            mini_batches: 10,
            reclaimed: false,
        })
        .collect();
    Snapshot {
        policy: None,
        job: job(n),
        containers,
        links: vec![],
    }
}

/// Two machine types (like the paper's r4.xlarge / r4.4xlarge) with ±10% noise.
fn heterogeneous(n: usize) -> Snapshot {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        0.9 + 0.2 * (x % 10_000) as f64 / 10_000.0
    };
    let containers = (0..n)
        .map(|i| {
            let fast = i % 8 == 0;
            let (c, b) = if fast {
                (2.5e-5, 6.0e8)
            } else {
                (1.0e-4, 1.5e8)
            };
            ContainerMetrics {
                id: format!("c{i:03}"),
                role: Role::Idle,
                compute_secs_per_record: Some(c * next()),
                cpu_speed: None,
                bandwidth_bytes_per_sec: b * next(),
                server_secs_per_byte: Some(2e-10 * next()),
                request_secs_per_server: None,
                server_secs_per_mini_batch: None,
                input_blocks: 0,
                model_blocks: 0,
                mini_batches: 10,
                reclaimed: false,
            }
        })
        .collect();
    Snapshot {
        policy: None,
        job: job(n),
        containers,
        links: vec![],
    }
}

fn bench(c: &mut Criterion) {
    let u = Uniform {
        compute_secs_per_record: 1e-4,
        bandwidth_bytes_per_sec: 1.5e8,
        server_secs_per_byte: 2e-10,
        request_secs_per_server: 0.0,
        server_secs_per_mini_batch: 0.0,
    };
    let mut g = c.benchmark_group("homogeneous");
    for n in [10usize, 100, 1_000, 10_000] {
        let j = job(n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| solve_homogeneous(black_box(&j), n, &u).map(|h| h.best))
        });
    }
    g.finish();
    let mut g = c.benchmark_group("uniform_solve");
    for n in [100usize, 1_000] {
        let model = CostModel::new(&uniform(n, &u)).expect("valid snapshot");
        g.bench_with_input(BenchmarkId::from_parameter(n), &model, |b, m| {
            b.iter(|| solve(black_box(m)).map(|s| s.epoch_secs))
        });
    }
    g.finish();
    let mut g = c.benchmark_group("heterogeneous");
    g.sample_size(10);
    for n in [8usize, 10, 16, 32, 64] {
        let model = CostModel::new(&heterogeneous(n)).expect("valid snapshot");
        g.bench_with_input(BenchmarkId::from_parameter(n), &model, |b, m| {
            b.iter(|| solve(black_box(m)).map(|s| s.epoch_secs))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
