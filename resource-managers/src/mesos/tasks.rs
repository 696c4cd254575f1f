//! The framework's tasks: the Mesos task states, an UPDATE turned into
//! `Running` or `Completed` (with the exit status read from the command
//! executor's message), and a task's end giving its resources back to the
//! agent's view. Part of the framework actor ([`super::Actor`]).

use serde_json::{Value, json};

use super::Actor;
use crate::{ExitStatus, RmEvent};

/// Terminal task states (`isTerminalState` in the master).
pub const TERMINAL_STATES: [&str; 8] = [
    "TASK_FINISHED",
    "TASK_FAILED",
    "TASK_KILLED",
    "TASK_LOST",
    "TASK_ERROR",
    "TASK_DROPPED",
    "TASK_GONE",
    "TASK_GONE_BY_OPERATOR",
];

/// Task states that are not terminal.
const LIVE_STATES: [&str; 6] = [
    "TASK_STAGING",
    "TASK_STARTING",
    "TASK_RUNNING",
    "TASK_KILLING",
    "TASK_UNREACHABLE",
    "TASK_UNKNOWN",
];

impl Actor {
    pub(super) fn on_update(&mut self, status: &Value) {
        let tid = status["task_id"]["value"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let state = status["state"].as_str().unwrap_or("").to_string();
        let agent = status["agent_id"]["value"].as_str().unwrap_or("");
        if let Some(uuid) = status["uuid"].as_str().filter(|u| !u.is_empty())
            && !agent.is_empty()
        {
            self.send(
                self.body(
                    "ACKNOWLEDGE",
                    json!({"agent_id": {"value": agent}, "task_id": {"value": tid}, "uuid": uuid}),
                ),
                vec![],
            );
        }
        if !TERMINAL_STATES.contains(&state.as_str()) && !LIVE_STATES.contains(&state.as_str()) {
            tracing::warn!(
                "Mesos UPDATE for task {tid:?} has state {state:?}, not a Mesos task state; ignored"
            );
            return;
        }
        let Some(t) = self.tasks.get_mut(&tid) else {
            tracing::debug!(task = %tid, %state, "update for a task this framework does not hold");
            return;
        };
        t.state = state.clone();
        if state == "TASK_RUNNING" && !t.running {
            t.running = true;
            let pid = status["container_status"]["executor_pid"]
                .as_u64()
                .and_then(|p| u32::try_from(p).ok());
            self.emit(RmEvent::Running {
                container: tid.clone(),
                pid,
            });
            return;
        }
        if TERMINAL_STATES.contains(&state.as_str()) {
            let message = status["message"].as_str().unwrap_or("");
            let reason = status["reason"].as_str().unwrap_or("");
            let exit = parse_exit(&state, message);
            let mut diag = state.clone();
            if !reason.is_empty() {
                diag.push_str(&format!(" ({reason})"));
            }
            if !message.is_empty() {
                diag.push_str(&format!(": {message}"));
            }
            self.finish_task(&tid, exit, diag);
        } else if matches!(state.as_str(), "TASK_UNREACHABLE" | "TASK_UNKNOWN") {
            tracing::warn!(task = %tid, %state, "Mesos task state unclear");
        }
    }

    pub(super) fn finish_task(&mut self, tid: &str, exit: ExitStatus, diagnostics: String) {
        let Some(t) = self.tasks.remove(tid) else {
            return;
        };
        if let Some(a) = self.agents.get_mut(&t.agent_id) {
            a.cpus += t.cpus;
            a.mem += t.mem;
        }
        tracing::info!(task = %tid, host = %t.host, %exit, released = t.released, "evaluator task ended");
        self.emit(RmEvent::Completed {
            container: tid.to_string(),
            exit,
            diagnostics,
            released: t.released,
        });
        self.update_capacity();
    }
}

/// The exit status in a terminal update, from the command executor's
/// message ("Command exited with status 3", "Command terminated with signal
/// Killed").
pub fn parse_exit(state: &str, message: &str) -> ExitStatus {
    if let Some(rest) = message.split("exited with status ").nth(1) {
        let digits: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '-')
            .collect();
        if let Ok(c) = digits.parse() {
            return ExitStatus::Code(c);
        }
    }
    if let Some(rest) = message.split("terminated with signal ").nth(1) {
        let name = rest.trim().trim_end_matches('.');
        if let Some(sig) = signal_number(name) {
            return ExitStatus::Signal(sig);
        }
    }
    if state == "TASK_FINISHED" {
        return ExitStatus::Code(0);
    }
    ExitStatus::Unknown
}

fn signal_number(name: &str) -> Option<i32> {
    let n = match name {
        "Hangup" | "SIGHUP" => 1,
        "Interrupt" | "SIGINT" => 2,
        "Quit" | "SIGQUIT" => 3,
        "Aborted" | "SIGABRT" => 6,
        "Killed" | "SIGKILL" => 9,
        "User defined signal 1" | "SIGUSR1" => 10,
        "Segmentation fault" | "SIGSEGV" => 11,
        "User defined signal 2" | "SIGUSR2" => 12,
        "Broken pipe" | "SIGPIPE" => 13,
        "Terminated" | "SIGTERM" => 15,
        other => return other.parse().ok(),
    };
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits() {
        assert_eq!(
            parse_exit("TASK_FAILED", "Command exited with status 3"),
            ExitStatus::Code(3)
        );
        assert_eq!(
            parse_exit("TASK_KILLED", "Command terminated with signal Killed"),
            ExitStatus::Signal(9)
        );
        assert_eq!(
            parse_exit("TASK_KILLED", "Command terminated with signal Terminated"),
            ExitStatus::Signal(15)
        );
        assert_eq!(parse_exit("TASK_FINISHED", ""), ExitStatus::Code(0));
        assert_eq!(
            parse_exit("TASK_LOST", "Agent removed"),
            ExitStatus::Unknown
        );
    }
}
