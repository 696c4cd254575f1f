//! The plan executor's [`OperationRunner`] in the AM: each operation becomes
//! an [`Event::PlanOp`] carried out by the job's event loop (the one owner of
//! job state), which answers when the operation has taken effect or failed.
//! The executor itself runs in its own task and reports with
//! [`Event::PlanDone`].

use tokio::sync::{mpsc, oneshot};

use cruise_optimizer::{OpError, OpReport, Operation, OperationRunner};

use crate::am::Event;

/// The plan executor's runner: forwards each operation to the event loop.
pub struct AmRunner {
    events: mpsc::Sender<Event>,
}

impl AmRunner {
    /// A runner that sends operations to the loop's event channel.
    pub fn new(events: mpsc::Sender<Event>) -> Self {
        AmRunner { events }
    }
}

impl OperationRunner for AmRunner {
    async fn execute(&self, op: &Operation) -> Result<OpReport, OpError> {
        let (reply, rx) = oneshot::channel();
        self.events
            .send(Event::PlanOp {
                op: op.clone(),
                reply,
            })
            .await
            .map_err(|_| OpError::new("the AM stopped"))?;
        rx.await
            .map_err(|_| OpError::new("the AM dropped the operation (job ending)"))?
    }
}
