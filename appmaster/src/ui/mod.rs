//! The job's pages: the live web UI the AM serves on its status port and
//! the report `cruise report` writes, drawn by the same code from the
//! job's history ([`crate::am::history`]) and, live, its status.
//!
//! A page is one HTML document with its style inline and its charts as
//! inline SVG ([`svg`]): loss, accuracy (or the app's derived metric) and
//! epoch time per epoch, the configuration timeline (every container by
//! role, plans marked), each plan with its operations on a time axis and
//! its predicted against measured epoch time, the containers table and
//! the optimizer's last look. The live page replaces its panels
//! ([`panels`]) every two seconds with a few lines of script; the report
//! has no script.

pub mod svg;

use std::fmt::Write;

use crate::am::Status;
use crate::am::history::{ContainerRow, OpRecord, Record};
use svg::{Band, Lane, Segment, Series, esc, num};

/// The colour of each role on the timeline.
pub const ROLE_COLORS: [(&str, &str); 4] = [
    ("worker", "#2e7d32"),
    ("server", "#1565c0"),
    ("idle", "#9e9e9e"),
    ("leaving", "#e65100"),
];

fn role_color(role: &str) -> &'static str {
    ROLE_COLORS
        .iter()
        .find(|(r, _)| *r == role)
        .map_or("#555", |(_, c)| c)
}

/// Where the pages' links to container logs lead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logs<'a> {
    /// No logs to link to.
    None,
    /// `{base}/{container}/stderr` (the live page: `/logs`; the report:
    /// `containers`, relative to the job's work directory).
    Under(&'a str),
}

/// One plan, from its start and end records.
struct PlanView<'a> {
    n: usize,
    start: f64,
    summary: &'a str,
    predicted: (f64, f64),
    forced: bool,
    end: Option<(f64, f64, &'a [OpRecord])>,
}

/// What the records say, gathered.
struct JobView<'a> {
    job_id: &'a str,
    app: &'a str,
    loss_name: &'a str,
    has_accuracy: bool,
    target_epochs: u32,
    runtime: &'a str,
    started_unix_ms: u64,
    epochs: Vec<&'a Record>,
    members: Vec<(f64, &'a [crate::am::history::Member])>,
    plans: Vec<PlanView<'a>>,
    decisions: Vec<(f64, &'a str)>,
    splits: Option<&'a [(u32, u32, f64)]>,
    containers: Option<&'a [ContainerRow]>,
    end: Option<&'a Record>,
    last_secs: f64,
}

fn at_secs(r: &Record) -> f64 {
    match r {
        Record::Job { .. } => 0.0,
        Record::Members { at_secs, .. }
        | Record::Epoch { at_secs, .. }
        | Record::Rollback { at_secs, .. }
        | Record::Decision { at_secs, .. }
        | Record::Splits { at_secs, .. }
        | Record::PlanStarted { at_secs, .. }
        | Record::PlanEnded { at_secs, .. }
        | Record::Containers { at_secs, .. }
        | Record::End { at_secs, .. } => *at_secs,
    }
}

impl<'a> JobView<'a> {
    fn new(records: &'a [Record]) -> Self {
        let mut v = JobView {
            job_id: "",
            app: "",
            loss_name: "loss",
            has_accuracy: false,
            target_epochs: 0,
            runtime: "",
            started_unix_ms: 0,
            epochs: Vec::new(),
            members: Vec::new(),
            plans: Vec::new(),
            decisions: Vec::new(),
            splits: None,
            containers: None,
            end: None,
            last_secs: 0.0,
        };
        for r in records {
            v.last_secs = v.last_secs.max(at_secs(r));
            match r {
                Record::Job {
                    job_id,
                    app,
                    loss_name,
                    has_accuracy,
                    epochs,
                    runtime,
                    started_unix_ms,
                    ..
                } => {
                    v.started_unix_ms = *started_unix_ms;
                    v.job_id = job_id;
                    v.app = app;
                    v.loss_name = loss_name;
                    v.has_accuracy = *has_accuracy;
                    v.target_epochs = *epochs;
                    v.runtime = runtime;
                }
                Record::Members { at_secs, members } => v.members.push((*at_secs, members)),
                Record::Epoch { .. } => v.epochs.push(r),
                // The epochs after the checkpoint's are trained again: the
                // records that follow tell them.
                Record::Rollback { epoch, .. } => v
                    .epochs
                    .retain(|e| matches!(e, Record::Epoch { epoch: n, .. } if n <= epoch)),
                Record::Decision { at_secs, text } => v.decisions.push((*at_secs, text)),
                Record::Splits { splits, .. } => v.splits = Some(splits),
                Record::PlanStarted {
                    plan,
                    at_secs,
                    summary,
                    predicted_before_secs,
                    predicted_after_secs,
                    forced,
                } => v.plans.push(PlanView {
                    n: *plan,
                    start: *at_secs,
                    summary,
                    predicted: (*predicted_before_secs, *predicted_after_secs),
                    forced: *forced,
                    end: None,
                }),
                Record::PlanEnded {
                    plan,
                    at_secs,
                    secs,
                    ops,
                } => {
                    if let Some(p) = v.plans.iter_mut().find(|p| p.n == *plan) {
                        p.end = Some((*at_secs, *secs, ops));
                    }
                }
                Record::Containers { rows, .. } => v.containers = Some(rows),
                Record::End { .. } => v.end = Some(r),
            }
        }
        v
    }

    /// The plans as bands on the job's time axis (a running plan up to now).
    fn plan_bands(&self) -> Vec<Band> {
        self.plans
            .iter()
            .map(|p| Band {
                from: p.start,
                to: p.end.map_or(self.last_secs, |e| e.0),
                label: format!("plan {}", p.n),
            })
            .collect()
    }

    /// Mean measured epoch time of up to three epochs ending before `t`,
    /// and of up to three starting after `u`.
    fn measured_around(&self, t: f64, u: f64) -> (Option<f64>, Option<f64>) {
        let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let e: Vec<(f64, f64)> = self
            .epochs
            .iter()
            .filter_map(|r| match r {
                Record::Epoch { at_secs, secs, .. } => Some((*at_secs, *secs)),
                _ => None,
            })
            .collect();
        let before: Vec<f64> = e.iter().filter(|(at, _)| *at <= t).map(|x| x.1).collect();
        let before = before[before.len().saturating_sub(3)..].to_vec();
        let after: Vec<f64> = e
            .iter()
            .filter(|(at, s)| at - s >= u)
            .take(3)
            .map(|x| x.1)
            .collect();
        (mean(before), mean(after))
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:16px;color:#222;max-width:1500px}\
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:18px 0 6px}\
.meta{color:#555;font-size:13px}.grid{display:flex;flex-wrap:wrap;gap:12px}\
svg.chart{background:#fff;border:1px solid #ddd;max-width:100%;height:auto}\
svg .ctitle{font-size:13px;font-weight:600}svg .tick{font-size:10px;fill:#444}\
svg .label{font-size:11px;fill:#444}svg .empty{font-size:13px;fill:#999}\
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;padding:3px 6px;text-align:right}\
th{background:#f3f3f3}td.l,th.l{text-align:left}.bad{color:#b00020}.ok{color:#2e7d32}\
.role{display:inline-block;width:10px;height:10px;margin-right:4px}";

/// A whole page: `live` pages poll `/panels` every two seconds.
pub fn page(records: &[Record], status: Option<&Status>, logs: Logs, live: bool) -> String {
    let view = JobView::new(records);
    let title = if view.job_id.is_empty() {
        "cruise job".to_string()
    } else {
        format!("cruise job {}", view.job_id)
    };
    let script = if live {
        "<script>setInterval(async()=>{try{const r=await fetch('/panels');\
         if(r.ok){document.getElementById('panels').innerHTML=await r.text();\
         const b=document.body.dataset;b.refreshes=(+b.refreshes||0)+1;}}catch(e){}},2000);</script>"
    } else {
        ""
    };
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head>\
         <body><div id=\"panels\">{}</div>{script}</body></html>",
        esc(&title),
        panels(records, status, logs)
    )
}

/// The page's contents (what the live page refreshes).
pub fn panels(records: &[Record], status: Option<&Status>, logs: Logs) -> String {
    let view = JobView::new(records);
    let mut out = String::new();
    header(&mut out, &view, status);
    out.push_str("<h2>Training</h2><div class=\"grid\">");
    training_charts(&mut out, &view);
    out.push_str("</div><h2>Configuration</h2>");
    out.push_str(&configuration_timeline(&view, status));
    plans(&mut out, &view);
    out.push_str("<h2>Containers</h2>");
    let live_rows = status.map(container_rows);
    let rows = live_rows.as_deref().or(view.containers).unwrap_or(&[]);
    containers_table(&mut out, rows, logs);
    optimizer(&mut out, &view, status);
    out
}

fn header(out: &mut String, v: &JobView, status: Option<&Status>) {
    let _ = write!(
        out,
        "<h1>cruise job <span id=\"job-id\">{}</span></h1><div class=\"meta\">app {} on {} · ",
        esc(v.job_id),
        esc(v.app),
        esc(v.runtime)
    );
    let done = v.epochs.len();
    let _ = write!(out, "{done} of {} epochs · ", v.target_epochs);
    match (v.end, status) {
        (
            Some(Record::End {
                outcome,
                error,
                final_loss,
                final_accuracy,
                at_secs,
            }),
            _,
        ) => {
            let class = if outcome == "finished" { "ok" } else { "bad" };
            let _ = write!(
                out,
                "<span id=\"outcome\" class=\"{class}\">{}</span> after {:.1} s",
                esc(outcome),
                at_secs
            );
            if let Some(l) = final_loss {
                let _ = write!(
                    out,
                    " · final {} {:.4} (the final model over all input)",
                    esc(v.loss_name),
                    l
                );
            }
            if let Some(a) = final_accuracy {
                let _ = write!(out, ", accuracy {:.2}%", a * 100.0);
            }
            if let Some(e) = error {
                let _ = write!(out, " · {}", esc(e));
            }
        }
        (_, Some(s)) => {
            let _ = write!(
                out,
                "phase <span id=\"phase\">{}</span> · {} records processed",
                esc(&s.phase),
                s.records_processed
            );
        }
        _ => out.push_str("running"),
    }
    out.push_str("</div>");
}

fn training_charts(out: &mut String, v: &JobView) {
    let mut loss = Vec::new();
    let mut acc = Vec::new();
    let mut derived = Vec::new();
    let mut derived_name = String::new();
    let mut times = Vec::new();
    for r in &v.epochs {
        if let Record::Epoch {
            epoch,
            secs,
            loss: l,
            accuracy,
            derived: d,
            ..
        } = r
        {
            let x = f64::from(*epoch);
            loss.push((x, *l));
            if let Some(a) = accuracy {
                acc.push((x, a * 100.0));
            }
            if let Some((name, val)) = d {
                derived_name.clone_from(name);
                derived.push((x, *val));
            }
            times.push((x, *secs));
        }
    }
    // Plans as bands between the epochs they fell in.
    let epoch_of = |t: f64| {
        let n = v
            .epochs
            .iter()
            .filter(|r| matches!(r, Record::Epoch { at_secs, .. } if *at_secs <= t))
            .count();
        n as f64 + 0.5
    };
    let marks: Vec<Band> = v
        .plan_bands()
        .into_iter()
        .map(|b| Band {
            from: epoch_of(b.from),
            to: epoch_of(b.to),
            label: b.label,
        })
        .collect();
    let loss_name = format!("training {}", v.loss_name);
    out.push_str(&svg::line_chart(
        &format!("{} per epoch", v.loss_name),
        "epoch",
        v.loss_name,
        &[Series {
            name: &loss_name,
            color: "#c62828",
            points: loss,
        }],
        &marks,
    ));
    if v.has_accuracy {
        out.push_str(&svg::line_chart(
            "accuracy per epoch",
            "epoch",
            "%",
            &[Series {
                name: "training accuracy",
                color: "#2e7d32",
                points: acc,
            }],
            &marks,
        ));
    }
    if !derived.is_empty() {
        out.push_str(&svg::line_chart(
            &format!("{derived_name} per epoch"),
            "epoch",
            &derived_name,
            &[Series {
                name: &derived_name,
                color: "#6a1b9a",
                points: derived,
            }],
            &marks,
        ));
    }
    out.push_str(&svg::bar_chart("epoch time", "epoch", "seconds", &times));
}

fn configuration_timeline(v: &JobView, status: Option<&Status>) -> String {
    // The live page draws up to now; a report up to its last record.
    let now = match (v.end, status) {
        (None, Some(_)) => v.last_secs.max(live_secs(v)),
        _ => v.last_secs,
    };
    let mut lanes: Vec<(u32, Lane)> = Vec::new();
    for (i, (t, members)) in v.members.iter().enumerate() {
        let until = v.members.get(i + 1).map_or(now, |n| n.0);
        for m in members.iter() {
            let lane = match lanes.iter_mut().find(|(id, _)| *id == m.id) {
                Some((_, l)) => l,
                None => {
                    lanes.push((
                        m.id,
                        Lane {
                            label: format!("e{} ", m.id),
                            segments: Vec::new(),
                        },
                    ));
                    &mut lanes.last_mut().expect("just pushed").1
                }
            };
            match lane.segments.last_mut() {
                Some(s) if s.class == m.role && (s.to - t).abs() < 1e-9 => s.to = until,
                _ => lane.segments.push(Segment {
                    from: *t,
                    to: until,
                    class: m.role.clone(),
                    color: role_color(&m.role).to_string(),
                    tip: format!("evaluator {} ({}): {}", m.id, m.container, m.role),
                }),
            }
        }
    }
    lanes.sort_by_key(|(id, _)| *id);
    let lanes: Vec<Lane> = lanes.into_iter().map(|(_, l)| l).collect();
    svg::timeline(
        "containers by role over time (plans marked)",
        "seconds since the job started",
        &lanes,
        &v.plan_bands(),
        now,
        &ROLE_COLORS,
    )
}

/// Seconds since the job started, by the wall clock (the live page).
fn live_secs(v: &JobView) -> f64 {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    now_ms.saturating_sub(v.started_unix_ms) as f64 / 1e3
}

fn plans(out: &mut String, v: &JobView) {
    let _ = write!(out, "<h2>Plans ({})</h2>", v.plans.len());
    if v.plans.is_empty() {
        out.push_str("<p class=\"meta\" id=\"no-plans\">no reconfiguration so far</p>");
        return;
    }
    out.push_str(
        "<table id=\"plans\"><tr><th>plan</th><th>started s</th><th>took s</th>\
         <th>predicted epoch s before → after</th><th>measured epoch s before → after</th>\
         <th>operations</th><th class=\"l\">summary</th></tr>",
    );
    for p in &v.plans {
        let (took, ops) = match p.end {
            Some((_, secs, ops)) => (format!("{secs:.2}"), ops),
            None => ("running".to_string(), &[][..]),
        };
        let (mb, ma) = v.measured_around(p.start, p.end.map_or(f64::MAX, |e| e.0));
        let m = |x: Option<f64>| x.map_or("–".to_string(), |v| format!("{v:.3}"));
        let failed = ops.iter().filter(|o| o.outcome != "succeeded").count();
        let _ = write!(
            out,
            "<tr class=\"plan\"><td>{}{}</td><td>{:.1}</td><td>{took}</td><td>{:.3} → {:.3}</td><td>{} → {}</td>\
             <td>{}{}</td><td class=\"l\">{}</td></tr>",
            p.n,
            if p.forced { " (forced)" } else { "" },
            p.start,
            p.predicted.0,
            p.predicted.1,
            m(mb),
            m(ma),
            ops.len(),
            if failed > 0 {
                format!(" <span class=\"bad\">({failed} not done)</span>")
            } else {
                String::new()
            },
            esc(p.summary)
        );
    }
    out.push_str("</table>");
    for p in &v.plans {
        let Some((_, secs, ops)) = p.end else {
            continue;
        };
        let lanes: Vec<Lane> = ops
            .iter()
            .map(|o| Lane {
                label: o.kind.clone(),
                segments: o
                    .start_secs
                    .map(|s| Segment {
                        from: s,
                        to: s + o.secs,
                        class: format!("op {}", o.outcome),
                        color: op_color(&o.kind, &o.outcome).to_string(),
                        tip: format!(
                            "{} {}: {} in {:.3} s{}{}",
                            o.kind,
                            o.what,
                            o.outcome,
                            o.secs,
                            if o.bytes > 0 {
                                format!(", {} bytes", o.bytes)
                            } else {
                                String::new()
                            },
                            o.error
                                .as_ref()
                                .map(|e| format!(": {e}"))
                                .unwrap_or_default()
                        ),
                    })
                    .into_iter()
                    .collect(),
            })
            .collect();
        out.push_str(&svg::timeline(
            &format!(
                "plan {}: operations ({} bytes moved)",
                p.n,
                ops.iter().map(|o| o.bytes).sum::<u64>()
            ),
            "seconds since the plan started",
            &lanes,
            &[],
            secs,
            &OP_COLORS,
        ));
    }
}

const OP_COLORS: [(&str, &str); 5] = [
    ("add", "#2e7d32"),
    ("delete", "#b71c1c"),
    ("switch", "#6a1b9a"),
    ("move", "#1565c0"),
    ("failed", "#ff6f00"),
];

fn op_color(kind: &str, outcome: &str) -> &'static str {
    if outcome != "succeeded" {
        return OP_COLORS[4].1;
    }
    OP_COLORS
        .iter()
        .find(|(k, _)| kind.starts_with(k) || (*k == "move" && kind.contains("input")))
        .map_or("#555", |(_, c)| c)
}

/// The containers table's rows from a status.
pub fn container_rows(s: &Status) -> Vec<ContainerRow> {
    s.evaluators
        .iter()
        .map(|e| {
            let m = s.metrics.evaluators.iter().find(|m| m.id == e.id);
            let t = s.metrics.totals.iter().find(|t| t.id == e.id);
            let link = s
                .metrics
                .capacity
                .iter()
                .filter(|l| l.from == e.id || l.to == e.id)
                .map(|l| l.bytes_per_sec)
                .reduce(f64::max);
            ContainerRow {
                id: e.id.0,
                container: e.container.clone(),
                host: e.host.clone(),
                role: crate::am::role_name(e.role).to_string(),
                pid: e.pid,
                input_blocks: e.input_blocks,
                model_blocks: e.model_blocks,
                store_bytes: e.store_bytes,
                rss_bytes: e.rss_bytes,
                compute_secs_per_record: m.and_then(|m| m.comp_secs_per_record),
                comm_secs_per_mini_batch: m.and_then(|m| m.comm_secs_per_mini_batch),
                batch_secs_per_mini_batch: m.and_then(|m| m.batch_secs_per_mini_batch),
                bytes_per_mini_batch: m.and_then(|m| m.bytes_per_mini_batch),
                cpu_speed: m.and_then(|m| m.cpu_speed),
                link_bytes_per_sec: link,
                mini_batches: t.map_or(0, |t| t.mini_batches),
                bytes: t.map_or(0, |t| t.pull_bytes + t.push_bytes),
                requests: t.map_or(0, |t| t.requests),
            }
        })
        .collect()
}

fn containers_table(out: &mut String, rows: &[ContainerRow], logs: Logs) {
    if rows.is_empty() {
        out.push_str("<p class=\"meta\">no containers yet</p>");
        return;
    }
    out.push_str(
        "<table id=\"containers\"><tr><th>evaluator</th><th class=\"l\">container</th><th class=\"l\">host</th>\
         <th class=\"l\">role</th><th>pid</th><th>input blocks</th><th>model blocks</th><th>held MB</th>\
         <th>RSS MB</th><th>compute µs/record</th><th>pull+push ms/mini-batch</th><th>ms/mini-batch</th>\
         <th>KB/mini-batch</th><th>CPU speed</th><th>link MB/s</th><th>mini-batches</th><th>MB moved</th>\
         <th>requests served</th><th class=\"l\">logs</th></tr>",
    );
    let o = |v: Option<f64>, scale: f64, digits: usize| {
        v.map_or("–".to_string(), |v| format!("{:.*}", digits, v * scale))
    };
    for r in rows {
        let log = match logs {
            Logs::Under(base) => format!(
                "<a href=\"{}/{}/stderr\">stderr</a>",
                esc(base),
                esc(&r.container)
            ),
            Logs::None => String::new(),
        };
        let _ = write!(
            out,
            "<tr class=\"container {role}\"><td>e{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td>\
             <td class=\"l\"><span class=\"role\" style=\"background:{}\"></span>{role}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{:.1}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{:.1}</td><td>{}</td><td class=\"l\">{log}</td></tr>",
            r.id,
            esc(&r.container),
            esc(&r.host),
            role_color(&r.role),
            r.pid,
            r.input_blocks,
            r.model_blocks,
            r.store_bytes as f64 / 1e6,
            r.rss_bytes as f64 / 1e6,
            o(r.compute_secs_per_record, 1e6, 3),
            o(r.comm_secs_per_mini_batch, 1e3, 2),
            o(r.batch_secs_per_mini_batch, 1e3, 2),
            o(r.bytes_per_mini_batch, 1e-3, 1),
            o(r.cpu_speed, 1.0, 2),
            o(r.link_bytes_per_sec, 1e-6, 1),
            r.mini_batches,
            r.bytes as f64 / 1e6,
            r.requests,
            role = esc(&r.role),
        );
    }
    out.push_str("</table>");
}

fn optimizer(out: &mut String, v: &JobView, status: Option<&Status>) {
    out.push_str("<h2>Optimizer</h2>");
    let last = status
        .and_then(|s| s.optimizer.as_deref())
        .or(v.decisions.last().map(|d| d.1));
    let _ = write!(
        out,
        "<p id=\"decision\">{}</p>",
        esc(last.unwrap_or("no decision yet"))
    );
    let splits = status
        .map(|s| s.splits.as_slice())
        .filter(|s| !s.is_empty())
        .or(v.splits);
    if let Some(splits) = splits.filter(|s| !s.is_empty()) {
        let best = splits.iter().map(|s| s.2).fold(f64::INFINITY, f64::min);
        out.push_str(
            "<table id=\"splits\"><tr><th>workers</th><th>servers</th><th>predicted epoch s</th></tr>",
        );
        for (w, s, secs) in splits {
            let mark = if (*secs - best).abs() < 1e-12 {
                " class=\"ok\""
            } else {
                ""
            };
            let _ = write!(
                out,
                "<tr{mark}><td>{w}</td><td>{s}</td><td>{}</td></tr>",
                num(*secs)
            );
        }
        out.push_str("</table><p class=\"meta\">the last look's predicted epoch time of each split, its containers taken as the mean one</p>");
    }
    if !v.decisions.is_empty() {
        out.push_str("<details><summary>decisions</summary><table><tr><th>s</th><th class=\"l\">decision</th></tr>");
        for (t, d) in v.decisions.iter().rev().take(50) {
            let _ = write!(
                out,
                "<tr><td>{t:.1}</td><td class=\"l\">{}</td></tr>",
                esc(d)
            );
        }
        out.push_str("</table></details>");
    }
}
