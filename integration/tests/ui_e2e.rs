//! The job made visible, end to end: a real `cruise run` that reconfigures
//! itself (the local runtime offers 6 containers 2 s in, and the job grows
//! into them), read over real HTTP while it runs — the web UI at `/`, its
//! panels, `/history`, `/metrics`, a container's log — then its history
//! file after it ends, and `cruise report` on it.
//!
//! Two more tests need external tools and are ignored by default; CI runs
//! them in their own stage (`integration/ui/ci.sh`, which installs Debian's
//! `prometheus` and `chromium`), with `CRUISE_UI_TOOLS_REQUIRED=1` so a
//! missing tool fails rather than skips:
//! - `promtool check metrics` accepts `/metrics`, and a real Prometheus
//!   scrapes it during the job;
//! - a headless Chromium renders the live page during a reconfiguration
//!   and the report after the job (screenshots in `target/ui/`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use cruise_integration::{Spawned, binary, required_tool, status_address, wait_for};

const WAIT: Duration = Duration::from_secs(300);

fn cruise() -> Command {
    let mut c = Command::new(binary("cruise").expect("cruise is built"));
    c.env_remove("RUST_LOG");
    c
}

/// A job that trains until stopped and grows from 4 to 6 containers
/// (the local runtime offers 6 from 2 s on); returns it and its status
/// address once a plan that added containers has ended (the optimizer may
/// first rearrange the 4 it has).
async fn growing_job(work: &Path) -> (Spawned, String) {
    let mut c = cruise();
    c.args(["run", "-n", "4", "-w", "2", "--epochs", "100000"])
        .args(["--set", "mlr.generate_samples=40000"])
        .args(["--set", "optimizer.interval_ms=300"])
        .args(["--set", "runtime.capacity_schedule=2:6"])
        .arg("--work-dir")
        .arg(work);
    let job = Spawned::spawn(c).unwrap();
    let addr = status_address(&job, WAIT).await.unwrap();
    let url = format!("http://{addr}/history");
    wait_for("a plan that added containers to end", WAIT, || {
        let url = url.clone();
        async move {
            let history: Vec<Value> = reqwest::get(&url).await.ok()?.json().await.ok()?;
            history
                .iter()
                .any(|r| r["event"] == "plan_ended" && added(r))
                .then_some(())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; the job said:\n{}", job.stderr()));
    (job, addr)
}

/// Whether a `plan_ended` record has an add that succeeded.
fn added(plan: &Value) -> bool {
    plan["ops"].as_array().is_some_and(|ops| {
        ops.iter()
            .any(|o| o["kind"] == "add" && o["outcome"] == "succeeded")
    })
}

/// Stops a job with SIGINT and waits for it to end.
async fn stop(mut job: Spawned) -> Spawned {
    let pid = job.child.id().expect("the job runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    job.wait(WAIT).await.unwrap();
    job
}

/// GET `http://{addr}{path}`: its content type and body; non-2xx fails.
async fn get(addr: &str, path: &str) -> (String, String) {
    let url = format!("http://{addr}{path}");
    let r = reqwest::get(&url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert!(r.status().is_success(), "GET {url}: {}", r.status());
    let ct = r
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (ct, r.text().await.unwrap())
}

/// What the live page and the report both show for a job that
/// reconfigured: loss and accuracy plots with their points, the timeline
/// with workers and servers, the plans table with the plan and its
/// operations; and nothing loaded from elsewhere.
fn assert_shows_the_job(html: &str, what: &str) {
    let points = html.matches(r#"class="point""#).count();
    assert!(points >= 4, "{what}: {points} plotted points");
    for needle in [
        r#"<svg class="chart line""#,
        r#"aria-label="accuracy per epoch""#,
        r#"<svg class="chart bars""#,
        r#"class="bar""#,
        r#"class="segment worker""#,
        r#"class="segment server""#,
        r#"class="plan-band""#,
        r#"<table id="plans">"#,
        r#"<tr class="plan">"#,
        r#"class="segment op succeeded""#,
        r#"<table id="containers">"#,
    ] {
        assert!(html.contains(needle), "{what}: no {needle}");
    }
    for external in ["src=\"http", "href=\"http", "@import", "url(http"] {
        assert!(!html.contains(external), "{what} loads {external}...");
    }
}

/// The records of a type in a history.
fn records<'a>(history: &'a [Value], event: &str) -> Vec<&'a Value> {
    history.iter().filter(|r| r["event"] == event).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_metrics_history_and_report_follow_a_job_that_reconfigures() {
    let dir = tempfile::tempdir().unwrap();
    let (job, addr) = growing_job(dir.path()).await;

    // The history so far, as the page draws it.
    let (ct, text) = get(&addr, "/history").await;
    assert!(ct.starts_with("application/json"), "{ct}");
    let history: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(history[0]["event"], "job", "{text}");
    assert!(!records(&history, "epoch").is_empty(), "{text}");
    let started = records(&history, "plan_started");
    let ended = records(&history, "plan_ended");
    assert!(!started.is_empty() && !ended.is_empty(), "{text}");
    assert!(
        ended.iter().any(|p| added(p)),
        "no plan added containers: {ended:?}"
    );
    let most = records(&history, "members")
        .iter()
        .map(|m| m["members"].as_array().map_or(0, Vec::len))
        .max()
        .unwrap_or(0);
    assert!(most > 4, "the members recorded never grew past 4: {text}");

    // The live page and its panels.
    let (ct, page) = get(&addr, "/").await;
    assert!(ct.starts_with("text/html"), "{ct}");
    assert_shows_the_job(&page, "the live page");
    assert!(page.contains("fetch('/panels')"), "the live page refreshes");
    let (_, panels) = get(&addr, "/panels").await;
    assert_shows_the_job(&panels, "the live panels");
    assert!(panels.contains(r#"id="phase">training"#), "{panels}");

    // A container's log, linked from the containers table.
    let status: Value = serde_json::from_str(&get(&addr, "/status").await.1).unwrap();
    let container = status["evaluators"][0]["container"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(page.contains(&format!("/logs/{container}/stderr")));
    get(&addr, &format!("/logs/{container}/stderr")).await;

    // Prometheus metrics: the text format, every sample well formed, and
    // the job's figures in them.
    let (ct, metrics) = get(&addr, "/metrics").await;
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or(("", ""));
        assert!(
            series.starts_with("cruise_") && value.parse::<f64>().is_ok(),
            "malformed sample {line:?}"
        );
    }
    let value = |series: &str| {
        metrics.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        })
    };
    assert!(
        value("cruise_records_processed_total").is_some_and(|v| v > 0.0),
        "{metrics}"
    );
    // Plans that ended since the history was read are counted too.
    assert!(
        value(r#"cruise_plans_total{outcome="succeeded"}"#)
            .is_some_and(|v| v >= ended.len() as f64),
        "{metrics}"
    );
    assert!(
        value(r#"cruise_plan_operations_total{kind="add",outcome="succeeded"}"#)
            .is_some_and(|v| v >= 1.0),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("cruise_worker_mini_batches_total{evaluator=\"e")),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("cruise_server_requests_total{evaluator=\"e")),
        "{metrics}"
    );

    // After the job: its history file ends with how it ended, and the
    // report draws the same pictures from it, with no script.
    let job = stop(job).await;
    assert!(job.stderr().contains("cancelled"), "{}", job.stderr());
    let history_dir = dir.path().join("jobs").join("history");
    let file = std::fs::read_dir(&history_dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .expect("a history file");
    let lines: Vec<Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let end = lines.last().unwrap();
    assert_eq!(end["event"], "end", "{end}");
    assert_eq!(end["outcome"], "cancelled", "{end}");
    assert!(lines.len() >= history.len());

    let report = report(dir.path()).await;
    let html = std::fs::read_to_string(&report).unwrap();
    assert_shows_the_job(&html, "the report");
    assert!(!html.contains("<script"), "the report has no script");
    assert!(html.contains(r#"id="outcome" class="bad">cancelled"#));
}

/// Runs `cruise report DIR`; returns the file it wrote.
async fn report(dir: &Path) -> PathBuf {
    let mut c = cruise();
    c.arg("report").arg(dir);
    let mut p = Spawned::spawn(c).unwrap();
    let status = p.wait(WAIT).await.unwrap();
    assert!(status.success(), "cruise report: {}", p.stderr());
    let out = PathBuf::from(p.stdout().trim());
    assert!(out.is_file(), "cruise report printed {out:?}");
    out
}

/// `promtool check metrics` accepts `/metrics` mid-job, and a real
/// Prometheus scrapes the job and answers a query on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs promtool and prometheus (Debian's prometheus); run by integration/ui/ci.sh"]
async fn promtool_accepts_the_metrics_and_prometheus_scrapes_them() {
    const TEST: &str = "promtool_accepts_the_metrics_and_prometheus_scrapes_them";
    let Some(promtool) = required_tool("promtool", "prometheus", TEST).unwrap() else {
        return;
    };
    let Some(prometheus) = required_tool("prometheus", "prometheus", TEST).unwrap() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (job, addr) = growing_job(dir.path()).await;

    let (_, metrics) = get(&addr, "/metrics").await;
    let mut check = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(check.stdin.as_mut().unwrap(), metrics.as_bytes()).unwrap();
    let out = check.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics:\n{said}\n{metrics}"
    );

    // A real Prometheus scraping the AM every second.
    let port = cruise_integration::free_port().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: cruise\n    static_configs:\n      - targets: ['{addr}']\n"
        ),
    )
    .unwrap();
    let mut prom = Command::new(&prometheus);
    prom.arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"));
    let prom = Spawned::spawn(prom).unwrap();
    let query =
        format!("http://127.0.0.1:{port}/api/v1/query?query=cruise_records_processed_total");
    let seen = wait_for("Prometheus to have scraped the job", WAIT, || {
        let query = query.clone();
        async move {
            let v: Value = reqwest::get(&query).await.ok()?.json().await.ok()?;
            let r = v["data"]["result"].as_array()?.first()?.clone();
            let n: f64 = r["value"][1].as_str()?.parse().ok()?;
            (n > 0.0).then_some(r)
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; prometheus said:\n{}", prom.stderr()));
    assert_eq!(seen["metric"]["job"], "cruise", "{seen}");
    drop(prom);
    stop(job).await;
}

/// Where the screenshots go: `target/ui/` (beside the test binaries'
/// profile directory).
fn screenshot_dir() -> PathBuf {
    let d = cruise_integration::target_dir()
        .expect("target dir")
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
        .join("ui");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A headless Chromium's view of `url`: the DOM after its scripts ran
/// for `budget_ms` of virtual time, and a screenshot at `png`.
async fn browse(chromium: &Path, url: &str, png: &Path, budget_ms: u32) -> String {
    let profile = tempfile::tempdir().unwrap();
    let common = |c: &mut Command| {
        c.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={budget_ms}"));
    };
    let mut shot = Command::new(chromium);
    common(&mut shot);
    shot.arg("--window-size=1400,2400")
        .arg(format!("--screenshot={}", png.display()))
        .arg(url);
    let mut p = Spawned::spawn(shot).unwrap();
    assert!(
        p.wait(WAIT).await.unwrap().success(),
        "chromium: {}",
        p.stderr()
    );
    assert!(png.is_file(), "no screenshot: {}", p.stderr());
    let mut dom = Command::new(chromium);
    common(&mut dom);
    dom.arg("--dump-dom").arg(url);
    let mut p = Spawned::spawn(dom).unwrap();
    assert!(
        p.wait(WAIT).await.unwrap().success(),
        "chromium: {}",
        p.stderr()
    );
    p.stdout()
}

/// A real browser shows the live page during a reconfiguration (after its
/// own refresh ran) and the report after the job, with the same elements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium (Debian's chromium); run by integration/ui/ci.sh"]
async fn a_browser_shows_the_live_page_and_the_report() {
    const TEST: &str = "a_browser_shows_the_live_page_and_the_report";
    let Some(chromium) = required_tool("chromium", "chromium", TEST).unwrap() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (job, addr) = growing_job(dir.path()).await;
    let shots = screenshot_dir();

    let live = browse(
        &chromium,
        &format!("http://{addr}/"),
        &shots.join("live.png"),
        5000,
    )
    .await;
    assert_shows_the_job(&live, "the live page in a browser");
    // The page's own refresh ran (it counts its successful refreshes).
    assert!(
        live.contains(r#"data-refreshes=""#),
        "the page never refreshed:\n{live}"
    );

    stop(job).await;
    let report = report(dir.path()).await;
    let html = browse(
        &chromium,
        &format!("file://{}", report.display()),
        &shots.join("report.png"),
        1000,
    )
    .await;
    assert_shows_the_job(&html, "the report in a browser");
    eprintln!("screenshots: {}", shots.display());
}
