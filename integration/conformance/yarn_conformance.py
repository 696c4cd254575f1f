"""Conformance run of yarn-api-client 1.0.3 (a third-party YARN RM REST client)
against `cruise-sim yarn`.

Usage: yarn_conformance.py READY_FILE EXPECTED_NODES EXPECTED_NODE_MEMORY_MB

The client probes GET /cluster, then reads cluster info, metrics, scheduler
and nodes, asks for new application ids, submits applications whose AM
commands really run, follows their state, lists attempts, and kills one.
Every answer is checked; the simulator's /sim/containers admin endpoint is
used to check that processes really ran and died. Exits non-zero on the
first failed check.
"""

import json
import os
import sys
import time
import urllib.request

from yarn_api_client.resource_manager import ResourceManager
from yarn_api_client.errors import APIError

DEADLINE_S = 30.0


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
    print(f"yarn_conformance: {check.passed} passed, {check.failed} failed", flush=True)
    return 1 if check.failed else 0


def wait_until(pred, what, timeout=DEADLINE_S):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def containers(admin):
    with urllib.request.urlopen(admin + "/containers", timeout=10) as r:
        return json.loads(r.read().decode())["containers"]


def submit(rm, name, command, attempts=1, memory=512):
    app_id = rm.cluster_new_application().data["application-id"]
    ctx = {
        "application-id": app_id,
        "application-name": name,
        "queue": "default",
        "application-type": "YARN",
        "max-app-attempts": attempts,
        "resource": {"memory": memory, "vCores": 1},
        "am-container-spec": {
            "environment": {"entry": [{"key": "GREETING", "value": "hello-{{USER}}"}]},
            "commands": {"command": command},
        },
    }
    rm.cluster_submit_application(ctx)
    return app_id


def state_of(rm, app_id):
    return rm.cluster_application_state(app_id).data["state"]


def main():
    ready = json.load(open(sys.argv[1]))
    nodes, node_mb = int(sys.argv[2]), int(sys.argv[3])
    url, admin = ready["url"], ready["admin_url"]
    check = Check()
    print(f"yarn_conformance: yarn-api-client against {url}", flush=True)

    rm = ResourceManager(service_endpoints=[url], timeout=10)
    rm.session.params = {"user.name": "alice"}
    check.ok(rm.get_active_endpoint().rstrip("/") == url, "GET /cluster probe accepted the RM as active")

    info = rm.cluster_information().data["clusterInfo"]
    check.ok(info["state"] == "STARTED" and info["haState"] == "ACTIVE", f"cluster info: {info['state']}/{info['haState']}")

    m = rm.cluster_metrics().data["clusterMetrics"]
    check.ok(m["totalMB"] == nodes * node_mb and m["activeNodes"] == nodes,
             f"metrics: totalMB={m['totalMB']} activeNodes={m['activeNodes']}")

    sched = rm.cluster_scheduler().data["scheduler"]["schedulerInfo"]
    check.ok(sched["type"] == "capacityScheduler", f"scheduler type {sched['type']}")

    ns = rm.cluster_nodes().data["nodes"]["node"]
    check.ok(len(ns) == nodes and all(n["state"] == "RUNNING" and n["availMemoryMB"] == node_mb for n in ns),
             f"nodes: {[(n['id'], n['state'], n['availMemoryMB']) for n in ns]}")
    check.ok(rm.cluster_node(ns[0]["id"]).data["node"]["id"] == ns[0]["id"], "single node lookup")

    check.ok(rm.cluster_applications().data == {"apps": None}, "empty app list is {\"apps\": null}")

    new = rm.cluster_new_application().data
    check.ok(new["application-id"].startswith("application_") and new["maximum-resource-capability"]["memory"] > 0,
             f"new-application: {new['application-id']} {new['maximum-resource-capability']['memory']} MB")

    # An AM that runs until killed.
    long_id = submit(rm, "conformance-long", "echo $GREETING $CONTAINER_ID > <LOG_DIR>/marker; exec sleep 600")
    wait_until(lambda: state_of(rm, long_id) == "RUNNING", f"{long_id} RUNNING")
    app = rm.cluster_application(long_id).data["app"]
    check.ok(app["user"] == "alice" and app["name"] == "conformance-long" and app["trackingUI"] == "ApplicationMaster",
             f"app {long_id}: user={app['user']} trackingUI={app['trackingUI']}")
    atts = rm.cluster_application_attempts(long_id).data["appAttempts"]["appAttempt"]
    check.ok(len(atts) == 1 and atts[0]["containerId"].startswith("container_"), f"one attempt with AM container {atts[0]['containerId']}")
    cont = rm.cluster_application_attempt_containers(long_id, atts[0]["appAttemptId"]).data["containers"]["container"]
    check.ok([c["containerId"] for c in cont] == [atts[0]["containerId"]], "attempt containers list the live AM container")
    am = next(c for c in containers(admin) if c["id"] == atts[0]["containerId"])
    marker = os.path.join(am["log_dir"], "marker")
    wait_until(lambda: os.path.exists(marker) and open(marker).read().strip(), "AM marker file")
    check.ok(open(marker).read().split() == ["hello-alice", am["id"]],
             f"AM really ran with expanded env and <LOG_DIR>: {open(marker).read().strip()!r}")
    pid = am["pid"]
    check.ok(pid and os.path.exists(f"/proc/{pid}"), f"AM process {pid} alive")

    kill = rm.cluster_application_kill(long_id).data
    check.ok(kill.get("state") in ("RUNNING", "KILLED"), f"kill answered with state {kill.get('state')}")
    wait_until(lambda: state_of(rm, long_id) == "KILLED", f"{long_id} KILLED")
    again = rm.cluster_application_kill(long_id).data
    check.ok(again.get("state") == "KILLED", "second kill PUT answers KILLED")
    app = rm.cluster_application(long_id).data["app"]
    check.ok(app["finalStatus"] == "KILLED" and "killed by user alice" in app["diagnostics"],
             f"killed app: finalStatus={app['finalStatus']} diagnostics={app['diagnostics']!r}")
    wait_until(lambda: not os.path.exists(f"/proc/{pid}") or " Z " in open(f"/proc/{pid}/stat").read(),
               "AM process gone", timeout=10)
    check.ok(True, "kill really stopped the AM process")

    ok_id = submit(rm, "conformance-ok", "test \"$GREETING\" = hello-alice")
    wait_until(lambda: state_of(rm, ok_id) in ("FINISHED", "FAILED"), f"{ok_id} finished")
    app = rm.cluster_application(ok_id).data["app"]
    check.ok(app["state"] == "FINISHED" and app["finalStatus"] == "SUCCEEDED",
             f"exit 0 AM: {app['state']}/{app['finalStatus']} {app['diagnostics']!r}")

    bad_id = submit(rm, "conformance-bad", "echo boom >&2; exit 5", attempts=2)
    wait_until(lambda: state_of(rm, bad_id) == "FAILED", f"{bad_id} FAILED")
    app = rm.cluster_application(bad_id).data["app"]
    check.ok("exitCode: 5" in app["diagnostics"] and "boom" in app["diagnostics"],
             f"failed AM diagnostics carry exit code and stderr: {app['diagnostics'][:120]!r}")
    atts = rm.cluster_application_attempts(bad_id).data["appAttempts"]["appAttempt"]
    check.ok(len(atts) == 2 and all(a["appAttemptState"] == "FAILED" for a in atts), "two failed attempts (max-app-attempts=2)")

    finished = rm.cluster_applications(states=["FINISHED"]).data["apps"]["app"]
    check.ok([a["id"] for a in finished] == [ok_id], "apps?states=FINISHED lists exactly the finished app")
    every = rm.cluster_applications().data["apps"]["app"]
    check.ok({a["id"] for a in every} == {long_id, ok_id, bad_id}, f"apps lists all {len(every)} submitted apps")

    try:
        rm.cluster_application("application_1_0001")
        check.ok(False, "unknown app must not answer 2xx")
    except APIError as e:
        check.ok("404" in str(e) and "NotFoundException" in str(e), "unknown app: 404 RemoteException")
    return finish(check)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TimeoutError as e:
        print(f"  FAIL  {e}", flush=True)
        print("yarn_conformance: failed (timeout)", flush=True)
        sys.exit(1)
