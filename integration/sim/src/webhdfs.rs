//! The webhdfs simulator (not implemented yet).

/// Command-line arguments of `cruise-sim webhdfs`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn main(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("cruise-sim webhdfs: not implemented yet")
}
