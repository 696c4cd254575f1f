//! Emulated clusters drawn by a seeded generator, for the optimizer's
//! benchmarks (`bench-fidelity`, `bench-optimizer --generated`).
//!
//! A cluster is 4 to 8 containers in 2 or 3 tiers. Each tier has a CPU
//! share drawn log-uniformly from [`CPU_RANGE`] and a link drawn
//! log-uniformly from [`MBIT_RANGE`]; the tiers' CPU and bandwidth are
//! correlated (the faster CPUs also the better linked), anti-correlated or
//! independent, in turn by the cluster's index. The CPU shares of all
//! containers together stay under [`CPU_BUDGET`] of the machine's cores
//! (beyond it containers contend and the emulation lies): a draw over it
//! is drawn again. The spec is an `[emulation] containers` string, its
//! tiers listed fastest CPU first, so that a job started with `W` workers
//! puts them on the fastest CPUs and the reversed spec on the slowest.
//!
//! Cluster `i` of seed `s` is always the same (ChaCha8, seeded by `s` and
//! `i`), whatever else is drawn: a row of a benchmark can be rerun alone.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// CPU shares, cores.
pub const CPU_RANGE: (f64, f64) = (0.05, 0.5);
/// Link bandwidths, Mbit/s.
pub const MBIT_RANGE: (f64, f64) = (25.0, 1000.0);
/// Containers per cluster.
pub const SIZE_RANGE: (u32, u32) = (4, 8);
/// The most of the machine's cores the containers' shares may add up to.
pub const CPU_BUDGET: f64 = 0.9;

/// How the tiers' CPU and bandwidth relate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Correlation {
    /// The faster CPUs have the faster links.
    Correlated,
    /// The faster CPUs have the slower links.
    Anti,
    /// Drawn independently.
    Independent,
    /// Given by hand (`--cluster`), not drawn.
    Given,
}

impl Correlation {
    /// The word used in the benchmarks' output.
    pub fn name(self) -> &'static str {
        match self {
            Correlation::Correlated => "correlated",
            Correlation::Anti => "anti-correlated",
            Correlation::Independent => "independent",
            Correlation::Given => "given",
        }
    }
}

/// One tier: `count` containers of one shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tier {
    /// Containers.
    pub count: u32,
    /// CPU share, cores (two decimals).
    pub cpu: f64,
    /// Link bandwidth, Mbit/s (whole).
    pub mbit: u32,
}

/// A generated cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// The seed it was drawn with.
    pub seed: u64,
    /// Its index under that seed.
    pub index: u32,
    /// How CPU and bandwidth relate across its tiers.
    pub correlation: Correlation,
    /// Its tiers, fastest CPU first.
    pub tiers: Vec<Tier>,
}

impl Cluster {
    /// Containers.
    pub fn size(&self) -> u32 {
        self.tiers.iter().map(|t| t.count).sum()
    }

    /// The `[emulation] containers` spec, tiers in listed order.
    pub fn spec(&self) -> String {
        self.tiers
            .iter()
            .map(|t| format!("{}*{:.2}/{}mbit", t.count, t.cpu, t.mbit))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The sum of the containers' CPU shares, cores.
    pub fn cpu_sum(&self) -> f64 {
        self.tiers.iter().map(|t| f64::from(t.count) * t.cpu).sum()
    }

    /// `seed/index`, as `--generated` takes it.
    pub fn label(&self) -> String {
        format!("{}/{}", self.seed, self.index)
    }
}

fn log_uniform(rng: &mut ChaCha8Rng, (lo, hi): (f64, f64)) -> f64 {
    (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln())).exp()
}

/// Cluster `index` of `seed`, for a machine of `cores` cores.
pub fn generate(seed: u64, index: u32, cores: f64) -> Cluster {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (u64::from(index) << 32) ^ 0x5eed);
    let correlation = match index % 3 {
        0 => Correlation::Correlated,
        1 => Correlation::Anti,
        _ => Correlation::Independent,
    };
    let size = rng.random_range(SIZE_RANGE.0..=SIZE_RANGE.1);
    let n_tiers = rng.random_range(2..=3u32);
    // Tier sizes: every tier non-empty, the rest dealt at random.
    let mut counts = vec![1u32; n_tiers as usize];
    for _ in n_tiers..size {
        let t = rng.random_range(0..n_tiers as usize);
        counts[t] += 1;
    }
    let budget = CPU_BUDGET * cores;
    // Distinct tiers: shares at least 25% apart and links 40% apart (two
    // tiers closer than that are one tier with noise). Rejection sampling
    // is bounded; past it the shares are scaled into the budget.
    let mut cpus = Vec::new();
    let mut mbits = Vec::new();
    for attempt in 0..1000 {
        cpus = (0..n_tiers)
            .map(|_| log_uniform(&mut rng, CPU_RANGE))
            .collect();
        mbits = (0..n_tiers)
            .map(|_| log_uniform(&mut rng, MBIT_RANGE))
            .collect();
        cpus.sort_by(|a, b| b.total_cmp(a));
        mbits.sort_by(|a, b| b.total_cmp(a));
        let apart = |v: &[f64], f: f64| v.windows(2).all(|w| w[0] >= w[1] * f);
        let sum: f64 = cpus
            .iter()
            .zip(&counts)
            .map(|(c, &k)| c * f64::from(k))
            .sum();
        if apart(&cpus, 1.25) && apart(&mbits, 1.4) && (sum <= budget || attempt == 999) {
            if sum > budget {
                let scale = budget / sum;
                for c in &mut cpus {
                    *c *= scale;
                }
            }
            break;
        }
    }
    match correlation {
        Correlation::Correlated | Correlation::Given => {}
        Correlation::Anti => mbits.reverse(),
        Correlation::Independent => {
            // A random permutation (Fisher-Yates).
            for i in (1..mbits.len()).rev() {
                let j = rng.random_range(0..=i);
                mbits.swap(i, j);
            }
        }
    }
    let tiers = counts
        .iter()
        .zip(cpus.iter().zip(&mbits))
        .map(|(&count, (&cpu, &mbit))| Tier {
            count,
            cpu: (cpu * 100.0).round().max(1.0) / 100.0,
            mbit: mbit.round() as u32,
        })
        .collect();
    Cluster {
        seed,
        index,
        correlation,
        tiers,
    }
}

/// A cluster given as an `[emulation] containers` spec (every container
/// with a CPU share and a bandwidth), consecutive equal shapes as one tier.
pub fn from_spec(spec: &str) -> anyhow::Result<Cluster> {
    let emu = cruise_conf::EmulationConfig {
        containers: spec.to_string(),
        ..cruise_conf::EmulationConfig::default()
    };
    let mut tiers: Vec<Tier> = Vec::new();
    for c in emu.parsed()? {
        let (Some(cpu), Some(bits)) = (c.cpu, c.bits_per_sec) else {
            anyhow::bail!("{spec:?}: every container needs a CPU share and a bandwidth");
        };
        let mbit = (bits / 1e6).round() as u32;
        match tiers.last_mut() {
            Some(t) if t.cpu == cpu && t.mbit == mbit => t.count += 1,
            _ => tiers.push(Tier {
                count: 1,
                cpu,
                mbit,
            }),
        }
    }
    Ok(Cluster {
        seed: 0,
        index: 0,
        correlation: Correlation::Given,
        tiers,
    })
}

/// Parses `SEED/INDEX`.
pub fn parse_label(s: &str) -> anyhow::Result<(u64, u32)> {
    let (a, b) = s
        .split_once('/')
        .ok_or_else(|| anyhow::anyhow!("{s:?} is not SEED/INDEX"))?;
    let seed = a
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("seed {a:?} in {s:?} is not a whole number"))?;
    let index = b
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("index {b:?} in {s:?} is not a whole number"))?;
    Ok((seed, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clusters_are_reproducible_and_within_bounds() {
        let mut kinds = [0; 3];
        for i in 0..60 {
            let c = generate(7, i, 2.0);
            assert_eq!(c, generate(7, i, 2.0), "cluster {i} is the same every time");
            assert!((SIZE_RANGE.0..=SIZE_RANGE.1).contains(&c.size()), "{c:?}");
            assert!(c.cpu_sum() <= CPU_BUDGET * 2.0 + 0.05, "{c:?}");
            assert!(c.tiers.len() >= 2 && c.tiers.iter().all(|t| t.count > 0));
            for t in &c.tiers {
                assert!(t.cpu >= 0.01 && t.cpu <= CPU_RANGE.1 + 0.005, "{c:?}");
                assert!(t.mbit >= 25 && t.mbit <= 1000, "{c:?}");
            }
            assert!(c.tiers.windows(2).all(|w| w[0].cpu >= w[1].cpu), "{c:?}");
            let up = c.tiers.windows(2).all(|w| w[0].mbit >= w[1].mbit);
            let down = c.tiers.windows(2).all(|w| w[0].mbit <= w[1].mbit);
            match c.correlation {
                Correlation::Correlated => assert!(up, "{c:?}"),
                Correlation::Anti => assert!(down, "{c:?}"),
                Correlation::Independent | Correlation::Given => {}
            }
            kinds[i as usize % 3] += 1;
            // The spec parses as the emulation's own.
            let emu = cruise_conf::EmulationConfig {
                containers: c.spec(),
                ..cruise_conf::EmulationConfig::default()
            };
            assert_eq!(emu.parsed().unwrap().len() as u32, c.size(), "{}", c.spec());
        }
        assert_ne!(generate(7, 0, 2.0), generate(8, 0, 2.0));
        let c = from_spec("2*0.3/400mbit, 0.15/100mbit, 0.15/100mbit").unwrap();
        assert_eq!(c.spec(), "2*0.30/400mbit, 2*0.15/100mbit");
        assert!(from_spec("2*0.3").is_err());
        assert_eq!(parse_label("7/3").unwrap(), (7, 3));
        assert!(parse_label("7").is_err() && parse_label("x/1").is_err());
    }
}
