//! The mesos simulator (not implemented yet).

/// Command-line arguments of `cruise-sim mesos`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn main(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("cruise-sim mesos: not implemented yet")
}
