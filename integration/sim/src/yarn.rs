//! The yarn simulator (not implemented yet).

/// Command-line arguments of `cruise-sim yarn`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn main(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("cruise-sim yarn: not implemented yet")
}
