//! `cruise`: the command line of cruise-rs.

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;

use cruise_appmaster::cli::{self, AppmasterArgs, Cli, Command};
use cruise_appmaster::{am, yarn_app};
use cruise_container::evaluator::{self, EvaluatorEnv, EvaluatorOptions};
use cruise_rm::yarn::orphan::{self, ServiceOwner};

fn init_logging(verbose: u8, default: &str) {
    let level = match verbose {
        0 => default,
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // No colour codes in files (e.g. a YARN container's stderr).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
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

/// A runtime of `threads` worker threads; the failure to start one is the
/// command's failure, already reported.
fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .map_err(|e| fail(format!("cannot start the async runtime: {e}")))
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    cruise_container::os::tune_allocator();
    let cli = Cli::parse();
    match cli.command {
        Command::Evaluator => evaluator_command(cli.verbose),
        Command::Run(args) => run_command(args, cli.verbose),
        Command::Submit(args) => submit_command(args, cli.verbose),
        Command::Status(args) => status_command(args, cli.verbose),
        Command::Kill(args) => kill_command(args, cli.verbose),
        Command::Logs(args) => logs_command(args, cli.verbose),
        Command::Appmaster(args) => appmaster_command(args, cli.verbose),
        Command::Datagen(args) => datagen_command(args, cli.verbose),
        Command::Plan(args) => plan_command(args),
        Command::Report(args) => {
            init_logging(cli.verbose, "warn");
            match cli::report(&args) {
                Ok(out) => {
                    println!("{}", out.display());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(format!("{e:#}")),
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

/// `cruise evaluator`: one evaluator, started by a resource manager. One
/// that cannot reach its AM, in the YARN service of a `cruise submit`
/// application, stops that service if the application is over
/// ([`check_application`]).
fn evaluator_command(verbose: u8) -> ExitCode {
    init_logging(verbose, "info");
    let vars: BTreeMap<String, String> = std::env::vars().collect();
    let env = match EvaluatorEnv::from_map(&vars) {
        Ok(e) => e,
        Err(e) => return fail(e),
    };
    let owner = ServiceOwner::from_env(&vars).unwrap_or_else(|e| {
        tracing::warn!(
            "{e}: should this evaluator lose its AM, it will not ask whether its application is over"
        );
        None
    });
    // One runtime thread: an evaluator's connections and its server
    // hand messages to each other on every request, and on one
    // thread that is a queue push, not a cross-thread wake-up. The
    // worker's loop and block encoding run on the blocking pool (see
    // `ps::run_worker`), so computing never holds up the frames.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
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
                if e.am_unreachable()
                    && let Some(owner) = &owner
                {
                    check_application(owner).await;
                }
                fail(e)
            }
        }
    })
}

/// An evaluator that lost its AM asks the RM whether the AM's application
/// is over and, if so, stops the evaluator service, which YARN would
/// otherwise keep relaunching (`cruise_rm::yarn::orphan`); while an
/// attempt of the AM runs or is coming, the service is left to it. Either
/// way the outcome is logged, naming the application, its state and the
/// service.
async fn check_application(owner: &ServiceOwner) {
    let (application, service) = (&owner.application, &owner.service);
    match owner.stop_if_ended(orphan::http_options()).await {
        Ok(verdict) => {
            tracing::warn!(%application, %service, "{}", owner.describe(&verdict));
        }
        Err(e) => tracing::error!(
            %application,
            %service,
            "cannot tell whether application {application} is over: {e}; leaving YARN service {service} as it is"
        ),
    }
}

/// `cruise run`: a whole job, the AM in this process. With `--resume`, the
/// job of a work directory continued from its checkpoint; a job that had
/// finished is not run again: that is said on stderr and the exit status
/// is 0 (its work is done).
fn run_command(args: cli::RunArgs, verbose: u8) -> ExitCode {
    init_logging(verbose, "warn");
    let json = args.json;
    let rt = match runtime(2) {
        Ok(r) => r,
        Err(code) => return code,
    };
    rt.block_on(async {
        let token = CancellationToken::new();
        on_signal(token.clone());
        if let Some(dir) = &args.resume {
            return match cli::resume(dir, !args.quiet, token).await {
                Ok(cli::Resumed::Ran(summary, config)) => print_summary(&summary, &config, json),
                Ok(cli::Resumed::AlreadyFinished(text)) => {
                    eprintln!("cruise: {text}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(format!("{e:#}")),
            };
        }
        let config = match args.conf.load() {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        match cli::run(args, token).await {
            Ok(summary) => print_summary(&summary, &config, json),
            Err(e) => fail(format!("{e:#}")),
        }
    })
}

/// Prints a finished job's summary on stdout: JSON, or text for people.
fn print_summary(
    summary: &cruise_appmaster::am::JobSummary,
    config: &cruise_conf::CruiseConfig,
    json: bool,
) -> ExitCode {
    if json {
        match serde_json::to_string_pretty(summary) {
            Ok(s) => println!("{s}"),
            Err(e) => return fail(e),
        }
    } else {
        print!("{}", cli::summary_text(summary, config));
    }
    ExitCode::SUCCESS
}

/// `cruise submit`: the job to YARN, the AM in a container.
fn submit_command(args: cli::SubmitArgs, verbose: u8) -> ExitCode {
    init_logging(verbose, "warn");
    if let Some(r) = args.conf.runtime
        && r != cli::RuntimeArg::Yarn
    {
        return fail(format!(
            "cruise submit runs the AM in a YARN container (--runtime yarn); \
             for {r:?} use `cruise run --runtime {}`",
            format!("{r:?}").to_lowercase()
        ));
    }
    let mut conf = args.conf.clone();
    conf.runtime = Some(cli::RuntimeArg::Yarn);
    let config = match conf.load() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let rt = match runtime(2) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let work = cruise_appmaster::datagen::work_dir(&config);
    match rt.block_on(yarn_app::submit(config, &work)) {
        Ok(s) => {
            if args.json {
                match serde_json::to_string_pretty(&s) {
                    Ok(j) => println!("{j}"),
                    Err(e) => return fail(e),
                }
            } else {
                println!("{}", s.application_id);
            }
            eprintln!(
                "cruise: submitted {} to {} (staging {}); follow it with `cruise status {0} --wait`, read its output with `cruise logs {0}`",
                s.application_id, s.rm, s.staging_dir
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("{e:#}")),
    }
}

/// What `status`, `kill` and `logs` start with: logging, the cluster's
/// configuration and a one-thread runtime; a failure is reported.
fn cluster_setup(
    cluster: &cli::ClusterFlags,
    verbose: u8,
) -> Result<(cruise_conf::CruiseConfig, tokio::runtime::Runtime), ExitCode> {
    init_logging(verbose, "warn");
    let config = cluster.load().map_err(fail)?;
    Ok((config, runtime(1)?))
}

/// `cruise status`: a YARN application's report, optionally once it ends.
fn status_command(args: cli::StatusArgs, verbose: u8) -> ExitCode {
    let (config, rt) = match cluster_setup(&args.cluster, verbose) {
        Ok(set) => set,
        Err(code) => return code,
    };
    rt.block_on(async {
        let mut last_state = String::new();
        loop {
            let r = match yarn_app::status(&config, &args.app_id).await {
                Ok(r) => r,
                Err(e) => return fail(format!("{e:#}")),
            };
            if args.wait && !r.app.is_final() {
                if r.app.state != last_state {
                    eprintln!("cruise: {} is {}", r.app.id, r.app.state);
                    last_state = r.app.state.clone();
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                continue;
            }
            if args.json {
                match serde_json::to_string_pretty(&r) {
                    Ok(j) => println!("{j}"),
                    Err(e) => return fail(e),
                }
            } else {
                print!("{}", yarn_app::status_text(&r));
            }
            if args.wait && r.app.final_status != "SUCCEEDED" {
                return ExitCode::FAILURE;
            }
            return ExitCode::SUCCESS;
        }
    })
}

/// `cruise kill`: a YARN application and its evaluator service.
fn kill_command(args: cli::AppIdArgs, verbose: u8) -> ExitCode {
    let (config, rt) = match cluster_setup(&args.cluster, verbose) {
        Ok(set) => set,
        Err(code) => return code,
    };
    match rt.block_on(yarn_app::kill(&config, &args.app_id)) {
        Ok(k) => {
            println!(
                "{}: {}; service {} {}",
                args.app_id,
                k.state,
                k.service,
                if k.service_destroyed {
                    "destroyed"
                } else {
                    "did not exist"
                }
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("{e:#}")),
    }
}

/// `cruise logs`: a YARN application's container logs.
fn logs_command(args: cli::LogsArgs, verbose: u8) -> ExitCode {
    let (config, rt) = match cluster_setup(&args.cluster, verbose) {
        Ok(set) => set,
        Err(code) => return code,
    };
    let files = if args.files.is_empty() {
        vec!["stdout".to_string(), "stderr".to_string()]
    } else {
        args.files.clone()
    };
    match rt.block_on(yarn_app::logs(&config, &args.app_id, &files, args.attempt)) {
        Ok((list, killed)) => {
            let many = list.len() > 1;
            for (name, text) in list {
                if many {
                    println!("==> {name} <==");
                }
                match text {
                    Some(t) => {
                        print!("{t}");
                        if many && !t.is_empty() && !t.ends_with('\n') {
                            println!();
                        }
                    }
                    None => println!("(no such file)"),
                }
            }
            if let Some(state) = killed {
                println!(
                    "cruise: {} was killed ({state}): its output ends where it was killed",
                    args.app_id
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("{e:#}")),
    }
}

/// `cruise appmaster`: the AM inside its YARN container.
fn appmaster_command(args: AppmasterArgs, verbose: u8) -> ExitCode {
    init_logging(verbose, "info");
    let rt = match runtime(2) {
        Ok(r) => r,
        Err(code) => return code,
    };
    rt.block_on(appmaster(args))
}

/// `cruise datagen`: a generated data set.
fn datagen_command(args: cli::DatagenArgs, verbose: u8) -> ExitCode {
    init_logging(verbose, "warn");
    match cli::datagen(args) {
        Ok((bytes, out)) => {
            eprintln!("cruise: wrote {bytes} bytes to {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("{e:#}")),
    }
}

/// `cruise plan`: what the optimizer predicts and decides from a snapshot.
fn plan_command(args: cli::PlanArgs) -> ExitCode {
    let result = match &args.splits {
        Some(order) => cruise_appmaster::whatif::splits_report(&args.snapshot, order, args.json),
        None => cruise_appmaster::whatif::report(
            &args.snapshot,
            &cruise_appmaster::whatif::WhatIf {
                containers: args.containers,
                min_gain: args.min_gain,
                remaining_epochs: args.remaining_epochs,
                json: args.json,
            },
        ),
    };
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// How this attempt of a YARN application starts its job (`None`: an
/// earlier attempt finished it, there is nothing to do). The first runs a
/// new job; a later one resumes the job from its newest checkpoint as
/// `cruise run --resume` does, or starts it afresh when there is none.
async fn attempt_start(
    config_file: &std::path::Path,
    setup: &yarn_app::AppmasterSetup,
) -> anyhow::Result<Option<am::JobStart>> {
    use am::resume::{Prepared, ResumeError, prepare_attempt};
    let fresh = am::JobStart::NewAs(setup.job_id.clone());
    if setup.attempt <= 1 {
        return Ok(Some(fresh));
    }
    let prepared = prepare_attempt(
        &setup.work,
        config_file,
        &setup.job_id,
        setup.config.clone(),
    )
    .await;
    match prepared {
        Ok(Prepared::Resume { resume, .. }) => {
            eprintln!(
                "cruise: attempt {} of {}: resuming job {} from checkpoint {} (epoch {})",
                setup.attempt,
                setup.application_id,
                resume.job_id,
                resume.folder,
                resume.manifest.epoch
            );
            Ok(Some(am::JobStart::Resume(resume)))
        }
        Ok(Prepared::Finished { job_id, history }) => {
            eprintln!(
                "cruise: attempt {} of {}: job {job_id} had already finished ({} says so); nothing to do",
                setup.attempt,
                setup.application_id,
                history.display()
            );
            Ok(None)
        }
        Err(e @ (ResumeError::NoCheckpoint { .. } | ResumeError::CheckpointsOff { .. })) => {
            eprintln!(
                "cruise: attempt {} of {}: starting job {} afresh: {e}",
                setup.attempt, setup.application_id, setup.job_id
            );
            Ok(Some(fresh))
        }
        Err(e) => Err(e.into()),
    }
}

/// `cruise appmaster`: the AM inside its YARN container. The summary goes to
/// stdout and `summary.json` in the container's log directory; a failure to
/// stderr and `summary.json`, with a non-zero exit so that YARN records it.
async fn appmaster(args: AppmasterArgs) -> ExitCode {
    let token = CancellationToken::new();
    on_signal(token.clone());
    let summary_path = yarn_app::am_log_dir().join(yarn_app::SUMMARY_FILE);
    let write_summary = |v: serde_json::Value| {
        if let Err(e) = std::fs::write(&summary_path, v.to_string()) {
            tracing::warn!("cannot write {}: {e}", summary_path.display());
        }
    };
    let setup = match yarn_app::appmaster_setup(&args.config).await {
        Ok(s) => s,
        Err(e) => {
            write_summary(serde_json::json!({"error": format!("{e:#}")}));
            return fail(format!("{e:#}"));
        }
    };
    tracing::info!(application = %setup.application_id, attempt = setup.attempt, job = %setup.job_id, service = %setup.service, am_bind = %setup.config.runtime.am_bind, "cruise AM starting");
    let start = match attempt_start(&args.config, &setup).await {
        Ok(Some(start)) => start,
        Ok(None) => {
            write_summary(serde_json::json!({
                "application": setup.application_id,
                "service": setup.service,
                "already_finished": setup.job_id,
            }));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            write_summary(serde_json::json!({"error": format!("{e:#}")}));
            return fail(format!("{e:#}"));
        }
    };
    let config = setup.config.clone();
    let input = config.job.input.clone();
    let result = cli::run_with(
        setup.config,
        input,
        setup.work,
        token,
        true,
        setup.factory,
        start,
    )
    .await;
    match result {
        Ok(summary) => {
            print!("{}", cli::summary_text(&summary, &config));
            write_summary(serde_json::json!({
                "application": setup.application_id,
                "service": setup.service,
                "summary": summary,
            }));
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Kept for a later attempt, or for whoever looks.
            let checkpoint_dir = config
                .checkpoint
                .enabled
                .then(|| config.checkpoint.dir.clone());
            write_summary(serde_json::json!({
                "application": setup.application_id,
                "service": setup.service,
                "error": e.to_string(),
                "checkpoint_dir": checkpoint_dir,
            }));
            fail(e)
        }
    }
}
