//! The namenode endpoint: metadata operations answered directly, data
//! operations redirected to the datanode listener, plus the standby namenode
//! and the fault injection of `--fail-first`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{FailWith, RemoteException, Request, Sim, encode_path, json_ok};

/// The namenode's router.
pub fn router(sim: Arc<Sim>) -> Router {
    Router::new().fallback(handle).with_state(sim)
}

/// A standby namenode: every request gets `StandbyException`.
pub fn standby_router() -> Router {
    Router::new().fallback(async |method: Method, uri: Uri| {
        tracing::debug!(%method, %uri, "standby namenode request");
        RemoteException::standby().into_response()
    })
}

const GET_OPS: &[&str] = &[
    "OPEN",
    "GETFILESTATUS",
    "LISTSTATUS",
    "GETCONTENTSUMMARY",
    "GETQUOTAUSAGE",
    "GETFILECHECKSUM",
    "GETHOMEDIRECTORY",
    "GETDELEGATIONTOKEN",
    "GETDELEGATIONTOKENS",
    "GET_BLOCK_LOCATIONS",
    "GETFILEBLOCKLOCATIONS",
    "GETACLSTATUS",
    "GETXATTRS",
    "GETTRASHROOT",
    "LISTXATTRS",
    "NULL",
    "CHECKACCESS",
    "LISTSTATUS_BATCH",
    "GETSERVERDEFAULTS",
    "GETSNAPSHOTDIFF",
    "GETSNAPSHOTDIFFLISTING",
    "GETSNAPSHOTTABLEDIRECTORYLIST",
    "GETSNAPSHOTLIST",
    "GETALLSTORAGEPOLICY",
    "GETSTORAGEPOLICY",
    "GETECPOLICY",
    "GETLINKTARGET",
    "GETFILELINKSTATUS",
    "GETSTATUS",
    "GETTRASHROOTS",
];
const PUT_OPS: &[&str] = &[
    "CREATE",
    "MKDIRS",
    "CREATESYMLINK",
    "RENAME",
    "SETREPLICATION",
    "SETOWNER",
    "SETPERMISSION",
    "SETTIMES",
    "RENEWDELEGATIONTOKEN",
    "CANCELDELEGATIONTOKEN",
    "MODIFYACLENTRIES",
    "REMOVEACLENTRIES",
    "REMOVEDEFAULTACL",
    "REMOVEACL",
    "SETACL",
    "SETXATTR",
    "REMOVEXATTR",
    "ENABLEECPOLICY",
    "DISABLEECPOLICY",
    "SETECPOLICY",
    "ALLOWSNAPSHOT",
    "DISALLOWSNAPSHOT",
    "CREATESNAPSHOT",
    "RENAMESNAPSHOT",
    "SETQUOTA",
    "SETQUOTABYSTORAGETYPE",
    "SETSTORAGEPOLICY",
    "SATISFYSTORAGEPOLICY",
    "NULL",
];
const POST_OPS: &[&str] = &[
    "APPEND",
    "CONCAT",
    "TRUNCATE",
    "UNSETSTORAGEPOLICY",
    "UNSETECPOLICY",
    "NULL",
];
const DELETE_OPS: &[&str] = &["DELETE", "DELETESNAPSHOT", "NULL"];

async fn handle(State(sim): State<Arc<Sim>>, method: Method, uri: Uri) -> Response {
    tracing::debug!(%method, %uri, "namenode request");
    if let Some(resp) = injected_failure(&sim) {
        return resp;
    }
    match dispatch(&sim, &method, &uri).await {
        Ok(resp) => resp,
        Err(e) => {
            tracing::debug!(%method, %uri, status = %e.status, exception = e.exception, message = %e.message, "namenode error");
            e.into_response()
        }
    }
}

/// Consumes one injected failure, if any are left.
fn injected_failure(sim: &Sim) -> Option<Response> {
    let took = sim
        .fail_remaining
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if !took {
        return None;
    }
    Some(match sim.fail_with {
        FailWith::Retriable => RemoteException::retriable(
            "The NameNode is in safe mode (injected by cruise-sim --fail-first)",
        )
        .into_response(),
        FailWith::Unavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            "Service Unavailable (injected by cruise-sim --fail-first)\n",
        )
            .into_response(),
    })
}

async fn dispatch(sim: &Sim, method: &Method, uri: &Uri) -> Result<Response, RemoteException> {
    let req = Request::parse(uri)?;
    let Some(op) = req.op() else {
        return Err(RemoteException::illegal_argument(
            "Invalid value for webhdfs parameter \"op\": op is missing",
        ));
    };
    let (known, class) = match *method {
        Method::GET => (GET_OPS, "GetOpParam"),
        Method::PUT => (PUT_OPS, "PutOpParam"),
        Method::POST => (POST_OPS, "PostOpParam"),
        Method::DELETE => (DELETE_OPS, "DeleteOpParam"),
        _ => {
            return Err(RemoteException::unsupported(format!(
                "HTTP method {method} is not supported by WebHDFS"
            )));
        }
    };
    if !known.contains(&op.as_str()) {
        return Err(RemoteException::illegal_argument(format!(
            "Invalid value for webhdfs parameter \"op\": No enum constant org.apache.hadoop.hdfs.web.resources.{class}.Op.{op}"
        )));
    }
    let user = req.user()?;
    let path = req.path.as_str();
    let store = &sim.store;
    match (method.clone(), op.as_str()) {
        (Method::GET, "GETFILESTATUS") => Ok(json_ok(store.get_file_status(path).await?)),
        (Method::GET, "LISTSTATUS") => {
            let list = store.list(path).await?;
            Ok(json_ok(json!({"FileStatuses": {"FileStatus": list}})))
        }
        (Method::GET, "LISTSTATUS_BATCH") if !sim.no_list_batch => {
            let start_after = req.param("startafter").unwrap_or("");
            let all = store.list(path).await?;
            let rest: Vec<_> = all
                .into_iter()
                .filter(|s| {
                    let name = s["pathSuffix"].as_str().unwrap_or("");
                    start_after.is_empty() || name > start_after
                })
                .collect();
            let remaining = rest.len().saturating_sub(sim.list_limit);
            let batch: Vec<_> = rest.into_iter().take(sim.list_limit).collect();
            Ok(json_ok(json!({
                "DirectoryListing": {
                    "partialListing": {"FileStatuses": {"FileStatus": batch}},
                    "remainingEntries": remaining,
                }
            })))
        }
        (Method::GET, "LISTSTATUS_BATCH") => Err(RemoteException::illegal_argument(
            "Invalid value for webhdfs parameter \"op\": No enum constant org.apache.hadoop.hdfs.web.resources.GetOpParam.Op.LISTSTATUS_BATCH",
        )),
        (Method::GET, "GETCONTENTSUMMARY") => Ok(json_ok(store.content_summary(path).await?)),
        (Method::GET, "GETHOMEDIRECTORY") => Ok(json_ok(json!({"Path": format!("/user/{user}")}))),
        (Method::GET, "GETTRASHROOT") => {
            Ok(json_ok(json!({"Path": format!("/user/{user}/.Trash")})))
        }
        (Method::GET, "OPEN") => {
            store.check_readable(path).await?;
            let offset = req.u64_param("offset")?.unwrap_or(0);
            let mut fwd = vec![("offset".to_string(), offset.to_string())];
            forward(&req, &mut fwd, &["length", "buffersize"])?;
            redirect(sim, &req, "OPEN", fwd)
        }
        (Method::PUT, "CREATE") => {
            let overwrite = req.bool_param("overwrite", false)?;
            req.permission_param("permission", 0o644)?;
            let mut fwd = vec![("overwrite".to_string(), overwrite.to_string())];
            forward(
                &req,
                &mut fwd,
                &[
                    "blocksize",
                    "buffersize",
                    "permission",
                    "replication",
                    "unmaskedpermission",
                    "createparent",
                    "createflag",
                ],
            )?;
            redirect(sim, &req, "CREATE", fwd)
        }
        (Method::POST, "APPEND") => {
            store.check_exists(path).await?;
            let mut fwd = Vec::new();
            forward(&req, &mut fwd, &["buffersize"])?;
            redirect(sim, &req, "APPEND", fwd)
        }
        (Method::PUT, "MKDIRS") => {
            let perm = req.permission_param("permission", 0o755)?;
            let ok = store.mkdirs(path, perm, &user).await?;
            Ok(json_ok(json!({"boolean": ok})))
        }
        (Method::PUT, "RENAME") => {
            let Some(dst) = req.param("destination") else {
                return Err(RemoteException::illegal_argument(
                    "Invalid value for webhdfs parameter \"destination\": null",
                ));
            };
            let dst = normalize_destination(dst)?;
            // With `renameoptions` the NameNode runs rename2: an empty 200 on
            // success, an exception otherwise.
            match req.param("renameoptions").filter(|o| !o.is_empty()) {
                Some(opts) => {
                    let mut overwrite = false;
                    for o in opts.split(',') {
                        match o.trim() {
                            "NONE" => {}
                            "OVERWRITE" => overwrite = true,
                            other => {
                                return Err(RemoteException::invalid_param(
                                    "renameoptions",
                                    other,
                                    "[NONE, OVERWRITE, TO_TRASH]",
                                ));
                            }
                        }
                    }
                    store.rename2(path, &dst, overwrite).await?;
                    Ok(empty_ok())
                }
                None => Ok(json_ok(json!({"boolean": store.rename(path, &dst).await?}))),
            }
        }
        (Method::DELETE, "DELETE") => {
            let recursive = req.bool_param("recursive", false)?;
            Ok(json_ok(
                json!({"boolean": store.delete(path, recursive).await?}),
            ))
        }
        (Method::PUT, "SETPERMISSION") => {
            let perm = req.permission_param("permission", 0o755)?;
            store.set_permission(path, perm).await?;
            Ok(empty_ok())
        }
        (Method::PUT, "SETREPLICATION") => {
            // One replica is all a local directory has; accept and report
            // true for files like HDFS does.
            let is_file = store.check_readable(path).await.is_ok();
            if !is_file {
                store.check_exists(path).await?;
            }
            Ok(json_ok(json!({"boolean": is_file})))
        }
        (Method::GET, "GETFILECHECKSUM") => Err(RemoteException::unsupported(
            "GETFILECHECKSUM is not implemented by the cruise-sim WebHDFS simulator",
        )),
        (_, other) => Err(RemoteException::unsupported(format!(
            "{other} is not implemented by the cruise-sim WebHDFS simulator"
        ))),
    }
}

/// Validates and copies the given optional parameters to the datanode URL.
fn forward(
    req: &Request,
    out: &mut Vec<(String, String)>,
    names: &[&str],
) -> Result<(), RemoteException> {
    for name in names {
        if let Some(v) = req.param(name) {
            match *name {
                "length" | "buffersize" | "blocksize" | "replication" => {
                    req.u64_param(name)?;
                }
                "permission" | "unmaskedpermission" => {
                    req.permission_param(name, 0)?;
                }
                "createparent" => {
                    req.bool_param(name, true)?;
                }
                _ => {}
            }
            out.push((name.to_string(), v.to_string()));
        }
    }
    Ok(())
}

/// The datanode URL for a data operation, answered as a 307 redirect or, with
/// `noredirect=true`, as `{"Location": ...}`. Like the real namenode it
/// carries `op`, `doas`/`user.name`, `namenoderpcaddress` and the sorted
/// operation parameters.
fn redirect(
    sim: &Sim,
    req: &Request,
    op: &str,
    mut params: Vec<(String, String)>,
) -> Result<Response, RemoteException> {
    let noredirect = req.bool_param("noredirect", false)?;
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    q.append_pair("op", op);
    for name in ["delegation", "doas", "user.name"] {
        if let Some(v) = req.param(name) {
            q.append_pair(name, v);
        }
    }
    q.append_pair("namenoderpcaddress", &sim.namenode_addr.to_string());
    params.sort();
    for (k, v) in &params {
        q.append_pair(k, v);
    }
    let location = format!(
        "http://{}/webhdfs/v1{}?{}",
        sim.datanode_addr,
        encode_path(&req.path),
        q.finish()
    );
    if noredirect {
        return Ok(json_ok(json!({"Location": location})));
    }
    let value = HeaderValue::from_str(&location)
        .map_err(|e| RemoteException::io(format!("cannot build a redirect: {e}")))?;
    let mut resp = StatusCode::TEMPORARY_REDIRECT.into_response();
    resp.headers_mut().insert(header::LOCATION, value);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(resp)
}

/// A RENAME destination: absolute, no `.`/`..`, slashes collapsed.
fn normalize_destination(dst: &str) -> Result<String, RemoteException> {
    if !dst.starts_with('/') {
        return Err(RemoteException::invalid_param(
            "destination",
            dst,
            "an absolute path",
        ));
    }
    let mut out = String::new();
    for seg in dst.split('/').filter(|s| !s.is_empty()) {
        if seg == "." || seg == ".." || seg.contains(':') {
            return Err(RemoteException::illegal_argument(format!(
                "Invalid path name Invalid file name: {dst}"
            )));
        }
        out.push('/');
        out.push_str(seg);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

fn empty_ok() -> Response {
    let mut resp = StatusCode::OK.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    resp
}
