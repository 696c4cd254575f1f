//! `cruise-sim`: protocol simulators for the pseudo-distributed sandbox.
//!
//! One binary, one subcommand per protocol. Each simulator binds to loopback,
//! speaks the real wire format (see `PROTOCOLS.md` at the repository root), and really
//! launches the processes it allocates.
//!
//! - `webhdfs` (module [`webhdfs`]): namenode and datanode endpoints over a local directory.
//! - `yarn` (module [`yarn`]): ResourceManager REST and YARN Services REST.
//! - `mesos` (module [`mesos`]): the v1 scheduler HTTP API with simulated agents.

mod mesos;
mod webhdfs;
mod yarn;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cruise-sim",
    version,
    about = "Protocol simulators: YARN, Mesos, WebHDFS on loopback"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve WebHDFS (namenode + datanode) over a local directory.
    Webhdfs(webhdfs::Args),
    /// Serve the YARN ResourceManager REST API and the YARN Services REST API.
    Yarn(yarn::Args),
    /// Serve the Mesos v1 scheduler HTTP API with simulated agents.
    Mesos(mesos::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Webhdfs(args) => webhdfs::main(args),
        Command::Yarn(args) => yarn::main(args),
        Command::Mesos(args) => mesos::main(args),
    }
}
