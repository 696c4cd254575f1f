//! Differential tests: the same WebHDFS and YARN REST calls, in the same
//! order, against `cruise-sim` and against a real Hadoop (the one of
//! `integration/hadoop/start.sh DIR`, named by `CRUISE_HADOOP_DIR`; the
//! test is `#[ignore]`d: run it with `-- --ignored`, as
//! `integration/hadoop/ci.sh` does; skipped without `CRUISE_HADOOP_DIR`
//! unless `CRUISE_HADOOP_REQUIRED=1`). For each call the test
//! compares what a client sees: the status code, a redirect and where it
//! points, the content type, and the body reduced to what clients read (the
//! exception name of a `RemoteException`, the value of `{"boolean": ..}`, the
//! fields of a file status, the keys of a JSON object).
//!
//! Every difference must be listed in [`KNOWN`] with its reason (the same
//! table is in PROTOCOLS.md, "Known differences from real Hadoop"); an
//! unlisted difference fails the test with the whole table, and so does a
//! listed one that no longer occurs, so the list stays true.

use std::collections::BTreeMap;

use cruise_integration::Sim;
use cruise_integration::hadoop::RealHadoop;
use reqwest::Method;
use serde_json::Value;

const USER: &str = "alice";

/// Differences between cruise-sim and real Hadoop that are kept, by call
/// name, with the reason.
const KNOWN: &[(&str, &str)] = &[(
    "mkdirs under / as a non-superuser",
    "cruise-sim does no permission checks: every user may write everywhere",
)];

/// One call: a name, the method, the path and query after `/webhdfs/v1`
/// or the RM's base (`{D}` is replaced by a directory unique to the run),
/// and a body for PUT/POST (sent to the datanode after a redirect).
struct Call {
    name: &'static str,
    method: Method,
    path: &'static str,
    body: Option<&'static str>,
    /// How to reduce the body to what clients read.
    view: View,
}

/// A call, written short in the tables below.
fn c(
    name: &'static str,
    method: Method,
    path: &'static str,
    body: Option<&'static str>,
    view: View,
) -> Call {
    Call {
        name,
        method,
        path,
        body,
        view,
    }
}

#[derive(Clone, Copy)]
enum View {
    /// The RemoteException's name, the boolean, or nothing.
    Plain,
    /// FileStatus fields that clients use (type, length, permission, owner).
    FileStatus,
    /// The group of a FileStatus.
    Group,
    /// The sorted names of a listing.
    Listing,
    /// The body's text.
    Text,
    /// The top-level keys of a JSON object and the keys of the object under
    /// each.
    Keys,
}

fn webhdfs_calls() -> Vec<Call> {
    use View::*;
    vec![
        c("mkdirs", Method::PUT, "{D}/dir?op=MKDIRS", None, Plain),
        c(
            "mkdirs again",
            Method::PUT,
            "{D}/dir?op=MKDIRS",
            None,
            Plain,
        ),
        c(
            "create",
            Method::PUT,
            "{D}/dir/a?op=CREATE",
            Some("hello\n"),
            Plain,
        ),
        c(
            "create an existing file without overwrite",
            Method::PUT,
            "{D}/dir/a?op=CREATE",
            Some("again\n"),
            Plain,
        ),
        c(
            "create with overwrite",
            Method::PUT,
            "{D}/dir/a?op=CREATE&overwrite=true",
            Some("hello world\n"),
            Plain,
        ),
        c(
            "status of a new file",
            Method::GET,
            "{D}/dir/a?op=GETFILESTATUS",
            None,
            FileStatus,
        ),
        c(
            "status of a new file: group",
            Method::GET,
            "{D}/dir/a?op=GETFILESTATUS",
            None,
            Group,
        ),
        c(
            "status of a missing file",
            Method::GET,
            "{D}/dir/missing?op=GETFILESTATUS",
            None,
            Plain,
        ),
        c("open", Method::GET, "{D}/dir/a?op=OPEN", None, Text),
        c(
            "open at an offset",
            Method::GET,
            "{D}/dir/a?op=OPEN&offset=6&length=5",
            None,
            Text,
        ),
        c(
            "open a missing file",
            Method::GET,
            "{D}/dir/missing?op=OPEN",
            None,
            Plain,
        ),
        c(
            "append",
            Method::POST,
            "{D}/dir/a?op=APPEND",
            Some("more\n"),
            Plain,
        ),
        c(
            "open after append",
            Method::GET,
            "{D}/dir/a?op=OPEN",
            None,
            Text,
        ),
        c("list", Method::GET, "{D}/dir?op=LISTSTATUS", None, Listing),
        c(
            "list a missing directory",
            Method::GET,
            "{D}/nodir?op=LISTSTATUS",
            None,
            Plain,
        ),
        c(
            "rename",
            Method::PUT,
            "{D}/dir/a?op=RENAME&destination={D}/dir/b",
            None,
            Plain,
        ),
        c(
            "rename a missing source",
            Method::PUT,
            "{D}/dir/a?op=RENAME&destination={D}/dir/c",
            None,
            Plain,
        ),
        c(
            "rename into a directory",
            Method::PUT,
            "{D}/dir/b?op=RENAME&destination={D}",
            None,
            Plain,
        ),
        c(
            "rename2 (renameoptions=NONE)",
            Method::PUT,
            "{D}/b?op=RENAME&destination={D}/dir/c&renameoptions=NONE",
            None,
            Plain,
        ),
        c(
            "create a second file",
            Method::PUT,
            "{D}/dir/d?op=CREATE",
            Some("d\n"),
            Plain,
        ),
        c(
            "rename2 onto an existing file",
            Method::PUT,
            "{D}/dir/c?op=RENAME&destination={D}/dir/d&renameoptions=NONE",
            None,
            Plain,
        ),
        c(
            "rename2 with OVERWRITE",
            Method::PUT,
            "{D}/dir/c?op=RENAME&destination={D}/dir/d&renameoptions=OVERWRITE",
            None,
            Plain,
        ),
        c(
            "rename2 of a missing source",
            Method::PUT,
            "{D}/dir/c?op=RENAME&destination={D}/dir/e&renameoptions=NONE",
            None,
            Plain,
        ),
        c(
            "rename2 to a missing parent",
            Method::PUT,
            "{D}/dir/d?op=RENAME&destination={D}/nodir/e&renameoptions=NONE",
            None,
            Plain,
        ),
        c(
            "rename2 into a directory",
            Method::PUT,
            "{D}/dir/d?op=RENAME&destination={D}&renameoptions=NONE",
            None,
            Plain,
        ),
        c(
            "list after renames",
            Method::GET,
            "{D}/dir?op=LISTSTATUS",
            None,
            Listing,
        ),
        c(
            "content summary",
            Method::GET,
            "{D}?op=GETCONTENTSUMMARY",
            None,
            Keys,
        ),
        c(
            "delete a non-empty directory without recursive",
            Method::DELETE,
            "{D}/dir?op=DELETE",
            None,
            Plain,
        ),
        c(
            "delete a missing file",
            Method::DELETE,
            "{D}/missing?op=DELETE",
            None,
            Plain,
        ),
        c(
            "unknown operation",
            Method::GET,
            "{D}?op=NOSUCHOP",
            None,
            Plain,
        ),
        c(
            "mkdirs under / as a non-superuser",
            Method::PUT,
            "{ROOTD}?op=MKDIRS",
            None,
            Plain,
        ),
        c(
            "delete recursively",
            Method::DELETE,
            "{D}?op=DELETE&recursive=true",
            None,
            Plain,
        ),
    ]
}

fn yarn_calls() -> Vec<Call> {
    use View::*;
    vec![
        c(
            "cluster info",
            Method::GET,
            "/ws/v1/cluster/info",
            None,
            Keys,
        ),
        c(
            "new application",
            Method::POST,
            "/ws/v1/cluster/apps/new-application",
            None,
            Keys,
        ),
        c(
            "an unknown application",
            Method::GET,
            "/ws/v1/cluster/apps/application_1000000000000_0999",
            None,
            Plain,
        ),
        c(
            "a malformed application id",
            Method::GET,
            "/ws/v1/cluster/apps/not_an_app",
            None,
            Plain,
        ),
        c(
            "kill an unknown application",
            Method::PUT,
            "/ws/v1/cluster/apps/application_1000000000000_0999/state",
            Some(r#"{"state":"KILLED"}"#),
            Plain,
        ),
        c(
            "an unknown service",
            Method::GET,
            "/app/v1/services/cruise-no-such-service?user.name=alice",
            None,
            Plain,
        ),
        c(
            "destroy an unknown service",
            Method::DELETE,
            "/app/v1/services/cruise-no-such-service?user.name=alice",
            None,
            Plain,
        ),
    ]
}

/// What a client sees of one call.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    status: u16,
    /// Where a redirect pointed: its path and operation, without the host.
    redirect: Option<String>,
    content_type: String,
    body: String,
}

fn reduce(view: View, status: u16, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body).into_owned();
    let json: Option<Value> = serde_json::from_slice(body).ok();
    if let Some(v) = &json
        && let Some(e) = v.get("RemoteException")
    {
        return format!("RemoteException {}", e["exception"].as_str().unwrap_or("?"));
    }
    if status >= 400 {
        // The Services API's errors: the diagnostics and code; the RM's:
        // the exception name.
        if let Some(v) = &json
            && let Some(d) = v.get("diagnostics")
        {
            return format!("diagnostics {d} code {}", v["code"]);
        }
        if let Some(v) = &json {
            return format!(
                "error {}",
                v["RemoteException"]["exception"]
                    .as_str()
                    .or(v["exception"].as_str())
                    .unwrap_or("(no exception name)")
            );
        }
        return "error (not JSON)".into();
    }
    match view {
        View::Plain => match &json {
            Some(v) if v.get("boolean").is_some() => format!("boolean {}", v["boolean"]),
            Some(v) => format!("json {v}"),
            None if text.is_empty() => "empty".into(),
            None => format!("text {text:?}"),
        },
        View::Text => format!("text {text:?}"),
        View::FileStatus => {
            let s = json.as_ref().map(|v| &v["FileStatus"]).cloned();
            match s {
                Some(s) => format!(
                    "type {} length {} permission {} owner {}",
                    s["type"], s["length"], s["permission"], s["owner"]
                ),
                None => format!("not a FileStatus: {text}"),
            }
        }
        View::Group => json
            .as_ref()
            .map(|v| format!("group {}", v["FileStatus"]["group"]))
            .unwrap_or_else(|| format!("not a FileStatus: {text}")),
        View::Listing => {
            let mut names: Vec<String> = json
                .as_ref()
                .and_then(|v| v["FileStatuses"]["FileStatus"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .map(|s| {
                    format!(
                        "{}:{}",
                        s["pathSuffix"].as_str().unwrap_or("?"),
                        s["type"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            names.sort();
            format!("entries {names:?}")
        }
        View::Keys => match &json {
            Some(Value::Object(m)) => {
                let mut out = Vec::new();
                for (k, v) in m {
                    match v {
                        Value::Object(inner) => {
                            let mut ks: Vec<&String> = inner.keys().collect();
                            ks.sort();
                            out.push(format!("{k}{ks:?}"));
                        }
                        _ => out.push(k.clone()),
                    }
                }
                out.sort();
                format!("keys {out:?}")
            }
            _ => format!("not a JSON object: {text}"),
        },
    }
}

/// The keys of a JSON object that a client needs, checked separately: the
/// real RM answers with more keys than cruise-sim, which is fine as long as
/// the ones clients read are there.
fn keys_subset(sim: &str, real: &str) -> bool {
    // "keys [..]" lists; every key of the sim must be in the real one.
    let parse = |s: &str| -> Vec<String> {
        s.trim_start_matches("keys ")
            .trim_matches(|c| c == '[' || c == ']')
            .split("\", \"")
            .map(|k| k.trim_matches('"').to_string())
            .collect()
    };
    let (s, r) = (parse(sim), parse(real));
    s.iter().all(|k| {
        // "obj[a, b]" entries: compare the sim's inner keys as a subset.
        match k.split_once('[') {
            Some((name, inner)) => r.iter().any(|rk| {
                rk.split_once('[').is_some_and(|(rn, rinner)| {
                    rn == name
                        && inner
                            .trim_end_matches(']')
                            .split(", ")
                            .all(|ik| rinner.contains(ik))
                })
            }),
            None => r.contains(k),
        }
    })
}

async fn perform(
    client: &reqwest::Client,
    base: &str,
    call: &Call,
    path: &str,
    webhdfs: bool,
) -> anyhow::Result<Seen> {
    let url = if webhdfs {
        let sep = if path.contains('?') { '&' } else { '?' };
        format!("{base}/webhdfs/v1{path}{sep}user.name={USER}")
    } else {
        format!("{base}{path}")
    };
    let mut req = client
        .request(call.method.clone(), &url)
        .header("Accept", "application/json");
    if !webhdfs && let Some(b) = call.body {
        req = req
            .header("Content-Type", "application/json")
            .body(b.to_string());
    }
    let r = req.send().await?;
    let mut status = r.status().as_u16();
    let mut redirect = None;
    let mut r = r;
    if status == 307 {
        let loc = r
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let parsed = reqwest::Url::parse(&loc)?;
        let op = parsed
            .query_pairs()
            .find(|(k, _)| k == "op")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        redirect = Some(format!("{} op={op}", parsed.path()));
        let mut follow = client.request(call.method.clone(), &loc);
        if let Some(b) = call.body {
            follow = follow.body(b.to_string());
        }
        r = follow.send().await?;
        status = r.status().as_u16();
    }
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|c| c.to_str().ok())
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let body = r.bytes().await?;
    Ok(Seen {
        status,
        redirect,
        content_type,
        body: reduce(call.view, status, &body),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real Hadoop: integration/hadoop/start.sh DIR, then CRUISE_HADOOP_DIR=DIR and --ignored"]
async fn webhdfs_and_yarn_rest_agree_with_real_hadoop() {
    let Some(h) =
        RealHadoop::from_env("webhdfs_and_yarn_rest_agree_with_real_hadoop").expect("the cluster")
    else {
        return;
    };
    let hdfs = Sim::start("webhdfs", &[]).expect("cruise-sim webhdfs");
    let yarn = Sim::start("yarn", &["--webhdfs", &hdfs.url]).expect("cruise-sim yarn");
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("http client");
    let d = format!("/tmp/cruise-diff-{}", std::process::id());
    let rootd = format!("/cruise-diff-{}", std::process::id());
    // The simulator starts empty; real HDFS has /tmp already.
    let mut rows: Vec<(String, Seen, Seen)> = Vec::new();
    let sim_nn = hdfs.url.clone();
    let real_nn = h.webhdfs_url();
    let setup = Call {
        name: "setup",
        method: Method::PUT,
        path: "",
        body: None,
        view: View::Plain,
    };
    perform(&client, &sim_nn, &setup, "/tmp?op=MKDIRS", true)
        .await
        .expect("creating /tmp on the simulator");
    for call in webhdfs_calls() {
        let path = call.path.replace("{D}", &d).replace("{ROOTD}", &rootd);
        let sim = perform(&client, &sim_nn, &call, &path, true)
            .await
            .unwrap_or_else(|e| panic!("{}: cruise-sim: {e}", call.name));
        let real = perform(&client, &real_nn, &call, &path, true)
            .await
            .unwrap_or_else(|e| panic!("{}: real WebHDFS: {e}", call.name));
        rows.push((format!("webhdfs: {}", call.name), sim, real));
    }
    let sim_rm = yarn.url.clone();
    let real_rm = h.rm_url();
    for call in yarn_calls() {
        let sim = perform(&client, &sim_rm, &call, call.path, false)
            .await
            .unwrap_or_else(|e| panic!("{}: cruise-sim: {e}", call.name));
        let real = perform(&client, &real_rm, &call, call.path, false)
            .await
            .unwrap_or_else(|e| panic!("{}: real RM: {e}", call.name));
        rows.push((format!("yarn: {}", call.name), sim, real));
    }

    let known: BTreeMap<&str, &str> = KNOWN.iter().copied().collect();
    let mut table = String::new();
    let mut unexpected = Vec::new();
    let mut stale: Vec<&str> = known.keys().copied().collect();
    for (name, sim, real) in &rows {
        let short = name.split_once(": ").map(|(_, n)| n).unwrap_or(name);
        let same = sim.status == real.status
            && sim.redirect == real.redirect
            && sim.content_type == real.content_type
            && (sim.body == real.body
                || (sim.body.starts_with("keys ") && keys_subset(&sim.body, &real.body)));
        let mark = if same {
            "same"
        } else if known.contains_key(short) {
            stale.retain(|k| *k != short);
            "KNOWN"
        } else {
            unexpected.push(name.clone());
            "DIFFERS"
        };
        table.push_str(&format!(
            "{mark:7} {name}\n        sim:  {} {:?} {} {}\n        real: {} {:?} {} {}\n",
            sim.status,
            sim.redirect,
            sim.content_type,
            sim.body,
            real.status,
            real.redirect,
            real.content_type,
            real.body
        ));
    }
    eprintln!("{table}");
    assert!(
        unexpected.is_empty(),
        "cruise-sim differs from real Hadoop in {unexpected:?} (fix the simulator or list the difference in KNOWN with its reason):\n{table}"
    );
    assert!(
        stale.is_empty(),
        "listed as known differences but now the same: {stale:?}; remove them from KNOWN:\n{table}"
    );
}
