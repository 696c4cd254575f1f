//! The server task: the data plane serves blocks whatever the role; this
//! task reports the serving figures periodically.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::PsError;
use super::cost::{codec_cpu_per_byte, store_cpu_per_byte};
use crate::peer::DataPlane;
use crate::protocol::{EvalToAm, ServerReport, TaskKind};

/// How often a server reports what serving costs it: often enough that the
/// optimizer's first look, a few dozen mini-batches into training, has a
/// figure from every server (workers report every 20 ms).
pub const SERVER_REPORT_PERIOD: Duration = Duration::from_millis(100);

/// Runs the server task: reports serving metrics every `period` until `stop`.
pub async fn run_server(
    dp: DataPlane,
    to_am: mpsc::Sender<EvalToAm>,
    stop: CancellationToken,
    period: Duration,
) -> Result<(), PsError> {
    let mut last = dp.serve_totals();
    let mut last_t = Instant::now();
    // Off the runtime's thread, where the serving and the control channel run.
    let opts = dp.frame_options();
    let codec_per_byte = tokio::task::spawn_blocking(move || codec_cpu_per_byte(opts))
        .await
        .unwrap_or(0.0);
    let store_per_byte = match dp.store().model_functions() {
        Some(model) => tokio::task::spawn_blocking(move || store_cpu_per_byte(model))
            .await
            .ok()
            .flatten(),
        None => None,
    };
    tracing::debug!(
        codec_per_byte,
        ?store_per_byte,
        "serving CPU per byte, seconds"
    );
    let mut tick = tokio::time::interval(period);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let now = dp.serve_totals();
        let t = Instant::now();
        let wall_per_cpu = crate::os::wall_per_cpu();
        let bytes = (now.bytes_in - last.bytes_in) + (now.bytes_out - last.bytes_out);
        // The store's part of the values: what it measured, at most its
        // slope per byte (`store_cpu_per_byte`): the rest of an
        // operation's cost comes with each request.
        let busy = (now.busy_secs - last.busy_secs).max(0.0);
        let store = store_per_byte.map_or(busy, |s| busy.min(s * bytes as f64));
        let values = store + codec_per_byte * bytes as f64;
        let own = (now.cpu_secs - last.cpu_secs).max(0.0);
        let report = ServerReport {
            own_secs: own * wall_per_cpu,
            values_secs: values.min(own) * wall_per_cpu,
            period_secs: (t - last_t).as_secs_f64(),
            requests: now.requests - last.requests,
            busy_secs: now.busy_secs - last.busy_secs,
            bytes_in: now.bytes_in - last.bytes_in,
            bytes_out: now.bytes_out - last.bytes_out,
        };
        tracing::debug!(
            ?report,
            idle_cpu_secs = now.idle_cpu_secs - last.idle_cpu_secs,
            "serving in the last period"
        );
        (last, last_t) = (now, t);
        if report.requests > 0 {
            to_am
                .send(EvalToAm::ServerReport(report))
                .await
                .map_err(|_| PsError::ChannelClosed)?;
        }
    }
    to_am
        .send(EvalToAm::TaskStopped {
            task: TaskKind::Server,
        })
        .await
        .map_err(|_| PsError::ChannelClosed)
}
