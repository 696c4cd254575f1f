"""HdfsCLI (PyPI `hdfs` 2.7.3) against the cruise-sim WebHDFS simulator.

Usage: webhdfs_hdfscli.py NAMENODE_URL STANDBY_URL SIM_ROOT
Every check asserts on what the simulator answered and, for writes, on the
bytes that landed in SIM_ROOT. Against a real HDFS, SIM_ROOT and
STANDBY_URL are "-": bytes are read back through WebHDFS and the standby
checks are skipped; $CONFORMANCE_BASE (default /conformance) is where the
files go. Exits non-zero with a message on the first
failure.
"""
import os
import sys

from hdfs import InsecureClient
from hdfs.util import HdfsError

NN, STANDBY, ROOT = sys.argv[1], sys.argv[2], sys.argv[3]
BASE = os.environ.get("CONFORMANCE_BASE", "/conformance") + "/hdfscli"


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"  ok  {what}")


def expect_error(fn, needle, what):
    try:
        fn()
    except HdfsError as e:
        check(needle in str(e), f"{what} (error: {str(e)[:80]})")
        return e
    raise AssertionError(f"{what}: no error raised")


def on_disk(path):
    if ROOT == "-":
        with c.read(path) as r:
            return r.read()
    with open(os.path.join(ROOT, path.lstrip("/")), "rb") as f:
        return f.read()


c = InsecureClient(NN, user="alice")

# status
st = c.status("/")
check(st["type"] == "DIRECTORY" and st["pathSuffix"] == "", "GETFILESTATUS / is a directory")

# mkdirs
check(c.makedirs(f"{BASE}/dir/sub", permission="750") is None, "MKDIRS with permission")
st = c.status(f"{BASE}/dir/sub")
check(st["type"] == "DIRECTORY" and st["owner"] == "alice" and st["permission"] == "750",
      "new directory owned by alice with permission 750")

# write / create (two-step, Content-Type octet-stream, overwrite=False)
c.write(f"{BASE}/a.txt", data=b"hello world\n", overwrite=False)
check(on_disk(f"{BASE}/a.txt") == b"hello world\n", "CREATE stored the bytes")
st = c.status(f"{BASE}/a.txt")
check(st["type"] == "FILE" and st["length"] == 12 and st["owner"] == "alice",
      "GETFILESTATUS of the new file: FILE, 12 bytes, owner alice")
expect_error(lambda: c.write(f"{BASE}/a.txt", data=b"x"), "already exists",
             "CREATE without overwrite on an existing file fails")
c.write(f"{BASE}/a.txt", data=b"0123456789\n", overwrite=True)
check(on_disk(f"{BASE}/a.txt") == b"0123456789\n", "CREATE overwrite=True replaced the file")

# append
c.write(f"{BASE}/a.txt", data=b"appended\n", append=True)
check(on_disk(f"{BASE}/a.txt") == b"0123456789\nappended\n", "APPEND added the bytes")

# read, whole and with offset/length
with c.read(f"{BASE}/a.txt") as r:
    check(r.read() == b"0123456789\nappended\n", "OPEN reads the whole file")
with c.read(f"{BASE}/a.txt", offset=3, length=4) as r:
    check(r.read() == b"3456", "OPEN with offset=3 length=4")
with c.read(f"{BASE}/a.txt", offset=11) as r:
    check(r.read() == b"appended\n", "OPEN with offset only")

# list
check(c.list(BASE) == ["a.txt", "dir"], "LISTSTATUS names, sorted")
detailed = dict(c.list(BASE, status=True))
check(detailed["a.txt"]["length"] == 20 and detailed["dir"]["type"] == "DIRECTORY",
      "LISTSTATUS with status")

# content summary, home directory
cs = c.content(BASE)
check(cs["length"] == 20 and cs["fileCount"] == 1 and cs["directoryCount"] == 3,
      "GETCONTENTSUMMARY counts")
check(c.resolve("rel/x") == "/user/alice/rel/x", "GETHOMEDIRECTORY resolves relative paths")

# rename
c.rename(f"{BASE}/a.txt", f"{BASE}/b.txt")
check(c.status(f"{BASE}/a.txt", strict=False) is None, "RENAME: source gone")
check(on_disk(f"{BASE}/b.txt") == b"0123456789\nappended\n", "RENAME: destination has the bytes")
c.rename(f"{BASE}/b.txt", f"{BASE}/dir")
check(c.status(f"{BASE}/dir/b.txt")["length"] == 20, "RENAME into an existing directory")

# delete
expect_error(lambda: c.delete(f"{BASE}/dir"), "non empty",
             "DELETE of a non-empty directory without recursive fails")
check(c.delete(f"{BASE}/dir", recursive=True) is True, "DELETE recursive returns true")
check(c.delete(f"{BASE}/dir") is False, "DELETE of a missing path returns false")
if ROOT == "-":
    check(c.status(f"{BASE}/dir", strict=False) is None, "DELETE removed it")
else:
    check(not os.path.exists(os.path.join(ROOT, BASE.lstrip("/"), "dir")), "DELETE removed it on disk")

# errors
e = expect_error(lambda: c.status(f"{BASE}/missing"), "does not exist",
                 "GETFILESTATUS of a missing path fails")
check(getattr(e, "exception", None) == "FileNotFoundException", "404 carries FileNotFoundException")
expect_error(lambda: c.read(f"{BASE}/missing").__enter__(), "not found",
             "OPEN of a missing path fails")

# HA: the standby answers StandbyException; HdfsCLI fails over to the next URL
if STANDBY != "-":
    ha = InsecureClient(f"{STANDBY};{NN}", user="alice")
    check(ha.status(BASE)["type"] == "DIRECTORY", "failover from a standby namenode")
    only_standby = InsecureClient(STANDBY, user="alice")
    expect_error(lambda: only_standby.status(BASE), "standby", "a lone standby reports StandbyException")
c.delete(BASE, recursive=True)

print("hdfscli: all checks passed")
