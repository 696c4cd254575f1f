//! `cruise`: the command line of cruise-rs.

use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;

use cruise_appmaster::cli::{self, Cli, Command};
use cruise_container::evaluator::{self, EvaluatorEnv, EvaluatorOptions};

fn init_logging(verbose: u8, default: &str) {
    let level = match verbose {
        0 => default,
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Cancels `token` on SIGINT or SIGTERM.
fn on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        token.cancel();
    });
}

fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Evaluator => {
            init_logging(cli.verbose, "info");
            let env = match EvaluatorEnv::from_env() {
                Ok(e) => e,
                Err(e) => return fail(e),
            };
            let rt = match runtime(2) {
                Ok(r) => r,
                Err(e) => return fail(format!("cannot start the async runtime: {e}")),
            };
            rt.block_on(async {
                let token = CancellationToken::new();
                on_signal(token.clone());
                match evaluator::run(env, EvaluatorOptions::default(), token).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        tracing::error!("{e}");
                        fail(e)
                    }
                }
            })
        }
        Command::Run(args) => {
            init_logging(cli.verbose, "warn");
            let json = args.json;
            let config = match args.conf.load() {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            let rt = match runtime(2) {
                Ok(r) => r,
                Err(e) => return fail(format!("cannot start the async runtime: {e}")),
            };
            rt.block_on(async {
                let token = CancellationToken::new();
                on_signal(token.clone());
                match cli::run(args, token).await {
                    Ok(summary) => {
                        if json {
                            match serde_json::to_string_pretty(&summary) {
                                Ok(s) => println!("{s}"),
                                Err(e) => return fail(e),
                            }
                        } else {
                            print!("{}", cli::summary_text(&summary, &config));
                        }
                        ExitCode::SUCCESS
                    }
                    Err(e) => fail(format!("{e:#}")),
                }
            })
        }
        Command::Datagen(args) => {
            init_logging(cli.verbose, "warn");
            match cli::datagen(args) {
                Ok((bytes, out)) => {
                    eprintln!("cruise: wrote {bytes} bytes to {}", out.display());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(format!("{e:#}")),
            }
        }
        Command::Plan(args) => {
            match cruise_appmaster::whatif::report(&args.snapshot, args.containers, args.min_gain) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Command::Config(args) => match args.conf.load() {
            Ok(c) => match toml::to_string_pretty(&c) {
                Ok(s) => {
                    print!("{s}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            },
            Err(e) => fail(e),
        },
    }
}
