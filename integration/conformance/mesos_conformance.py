"""Conformance run of pymesos 0.3.15 (a third-party Mesos v1 scheduler HTTP API
client) against `cruise-sim mesos`.

Usage: mesos_conformance.py READY_FILE [FOLLOWER_READY_FILE]

With a follower (a `cruise-sim mesos --leader-redirect` instance), pymesos
is pointed at the follower and must follow its 307 to the leader.

pymesos subscribes (after GET /version), receives offers, launches real
short commands, receives their status updates and acknowledges them itself
(implicit acknowledgements), kills a long task, and tears the framework down
on stop(). Each step is asserted; the simulator's /sim/state admin endpoint
and the task sandboxes on disk are used to check what pymesos cannot see
(that acknowledgements arrived, that processes ran and the teardown removed
the framework). Exits non-zero on the first failed check.
"""

import glob
import json
import logging
import os
import re
import sys
import threading
import time
import urllib.request

from pymesos import MesosSchedulerDriver, Scheduler

DEADLINE_S = 45.0


class Check:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def ok(self, cond, what):
        if cond:
            self.passed += 1
            print(f"  ok    {what}", flush=True)
        else:
            self.failed += 1
            print(f"  FAIL  {what}", flush=True)
            raise SystemExit(finish(self))


def finish(check):
    print(f"mesos_conformance: {check.passed} passed, {check.failed} failed", flush=True)
    return 1 if check.failed else 0


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read().decode())


def wait_until(pred, what, timeout=DEADLINE_S):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def scalar(offer, name):
    return sum(r["scalar"]["value"] for r in offer["resources"] if r["name"] == name)


class Sched(Scheduler):
    """Launches the tasks of `plan` one per offer; records everything."""

    def __init__(self, plan):
        self.lock = threading.Lock()
        self.plan = list(plan)
        self.framework_id = None
        self.master_info = None
        self.offers_seen = []
        self.updates = {}  # task id -> list of statuses
        self.heartbeats = 0
        self.errors = []
        self.cond = threading.Condition(self.lock)

    def registered(self, driver, framework_id, master_info):
        with self.cond:
            self.framework_id = framework_id["value"]
            self.master_info = dict(master_info)
            self.cond.notify_all()

    def processHeartBeat(self, driver):
        with self.cond:
            self.heartbeats += 1

    def resourceOffers(self, driver, offers):
        for offer in offers:
            with self.cond:
                self.offers_seen.append(offer)
                task = self.plan.pop(0) if self.plan else None
            if task is None:
                driver.declineOffer(offer["id"], dict(refuse_seconds=60))
                continue
            task_id, command = task
            info = dict(
                task_id=dict(value=task_id),
                agent_id=dict(value=offer["agent_id"]["value"]),
                name=f"conformance {task_id}",
                command=dict(
                    value=command,
                    environment=dict(variables=[dict(name="GREETING", value="hello")]),
                ),
                resources=[
                    dict(name="cpus", type="SCALAR", scalar=dict(value=0.1)),
                    dict(name="mem", type="SCALAR", scalar=dict(value=32)),
                ],
            )
            driver.launchTasks(offer["id"], [info], dict(refuse_seconds=0.1))

    def statusUpdate(self, driver, update):
        with self.cond:
            self.updates.setdefault(update["task_id"]["value"], []).append(dict(update))
            self.cond.notify_all()

    def error(self, driver, message):
        with self.cond:
            self.errors.append(message)

    def states(self, task_id):
        with self.cond:
            return [u["state"] for u in self.updates.get(task_id, [])]

    def last(self, task_id):
        with self.cond:
            return (self.updates.get(task_id) or [None])[-1]


def main():
    logging.basicConfig(level=logging.WARNING)
    ready = json.load(open(sys.argv[1]))
    master = ready["master"]
    start_at = master
    if len(sys.argv) > 2:
        start_at = json.load(open(sys.argv[2]))["master"]
    admin = ready["admin_url"]
    work_dir = ready["work_dir"]
    check = Check()
    print(f"mesos_conformance: pymesos against {master}", flush=True)

    plan = [
        ("ok-task", "echo conformance-$GREETING > out.txt; echo to-stdout; sleep 0.3; exit 0"),
        ("fail-task", "echo failing >&2; exit 7"),
        ("long-task", "exec sleep 600"),
    ]
    sched = Sched(plan)
    framework = dict(user=os.environ.get("USER", "root"), name="pymesos-conformance", hostname="localhost")
    driver = MesosSchedulerDriver(sched, framework, start_at, use_addict=True, implicit_acknowledgements=True)
    driver.start()
    try:
        wait_until(lambda: sched.framework_id, "SUBSCRIBED")
        if start_at != master:
            check.ok(driver.master == master, f"pymesos followed the 307 from {start_at} to the leader {driver.master}")
        check.ok(driver.version == "1.11.0", f"GET /version read by pymesos ({driver.version})")
        check.ok(re.fullmatch(r"[0-9a-f-]{36}-\d{4}", sched.framework_id) is not None,
                 f"SUBSCRIBED framework id {sched.framework_id} (<master id>-NNNN)")
        check.ok(driver.stream_id and len(driver.stream_id) >= 32, f"Mesos-Stream-Id header read ({driver.stream_id})")

        wait_until(lambda: len(sched.offers_seen) >= 1, "OFFERS")
        o = sched.offers_seen[0]
        check.ok(
            scalar(o, "cpus") > 0 and scalar(o, "mem") > 0 and any(r["name"] == "ports" for r in o["resources"]),
            f"offer {o['id']['value']} carries cpus/mem/ports (nested offers.offers shape)",
        )
        check.ok(re.fullmatch(r"[0-9a-f-]{36}-S\d+", o["agent_id"]["value"]) is not None,
                 f"offer names its agent ({o['agent_id']['value']})")

        # ok-task: STARTING -> RUNNING -> FINISHED, each update acknowledged by pymesos.
        wait_until(lambda: "TASK_FINISHED" in sched.states("ok-task"), "ok-task TASK_FINISHED")
        st = sched.states("ok-task")
        check.ok(st == ["TASK_STARTING", "TASK_RUNNING", "TASK_FINISHED"], f"ok-task update sequence {st}")
        last = sched.last("ok-task")
        check.ok(all("uuid" in u for u in sched.updates["ok-task"]), "executor updates carry a uuid")
        check.ok(last.get("message") == "Command exited with status 0", f"FINISHED message: {last.get('message')!r}")
        outs = glob.glob(os.path.join(work_dir, "agents", "*", "frameworks", sched.framework_id,
                                      "executors", "ok-task", "runs", "*", "out.txt"))
        check.ok(outs and open(outs[0]).read().strip() == "conformance-hello",
                 "the task really ran with command.environment (sandbox out.txt)")
        stdouts = [p.replace("out.txt", "stdout") for p in outs]
        check.ok(stdouts and open(stdouts[0]).read().strip() == "to-stdout", "task stdout captured in the sandbox")
        # The master forgets a task once its terminal update is acknowledged.
        wait_until(lambda: not any(t["task_id"] == "ok-task" for t in get_json(admin + "/state")["tasks"]),
                   "ok-task acknowledged")
        check.ok(True, "ACKNOWLEDGE of the terminal update reached the master")

        wait_until(lambda: "TASK_FAILED" in sched.states("fail-task"), "fail-task TASK_FAILED")
        check.ok(sched.last("fail-task").get("message") == "Command exited with status 7",
                 f"TASK_FAILED carries the exit status: {sched.last('fail-task').get('message')!r}")

        wait_until(lambda: "TASK_RUNNING" in sched.states("long-task"), "long-task TASK_RUNNING")
        pid = sched.last("long-task")["container_status"]["executor_pid"]
        check.ok(os.path.exists(f"/proc/{pid}"), f"long-task process {pid} is alive")
        driver.killTask(dict(value="long-task"))
        wait_until(lambda: "TASK_KILLED" in sched.states("long-task"), "long-task TASK_KILLED")
        check.ok("signal" in sched.last("long-task").get("message", ""),
                 f"TASK_KILLED message: {sched.last('long-task').get('message')!r}")
        wait_until(lambda: not os.path.exists(f"/proc/{pid}") or " Z " in open(f"/proc/{pid}/stat").read(),
                   "killed process gone", timeout=10)
        check.ok(True, "KILL really stopped the process")

        # Explicit reconciliation of an unknown task answers TASK_LOST.
        driver.reconcileTasks([dict(task_id=dict(value="no-such-task"))])
        wait_until(lambda: "TASK_LOST" in sched.states("no-such-task"), "reconcile answer")
        lost = sched.last("no-such-task")
        check.ok(lost.get("reason") == "REASON_RECONCILIATION" and "uuid" not in lost,
                 "RECONCILE of an unknown task: TASK_LOST, REASON_RECONCILIATION, no uuid")

        wait_until(lambda: sched.heartbeats >= 1, "a HEARTBEAT event")
        check.ok(sched.heartbeats >= 1, f"HEARTBEAT events processed ({sched.heartbeats})")
        check.ok(not sched.errors, f"no ERROR events ({sched.errors})")
    finally:
        fid = sched.framework_id
        driver.stop()
        driver.join()

    state = wait_until(lambda: (lambda s: s if fid not in [f["id"] for f in s["frameworks"]] else None)(get_json(admin + "/state")),
                       "framework removed after TEARDOWN", timeout=15)
    check.ok(fid in state["removed_frameworks"], "stop() sent TEARDOWN: framework removed")
    check.ok(not [t for t in state["tasks"] if t["framework_id"] == fid], "no tasks left after TEARDOWN")
    return finish(check)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TimeoutError as e:
        print(f"  FAIL  {e}", flush=True)
        print("mesos_conformance: failed (timeout)", flush=True)
        sys.exit(1)
