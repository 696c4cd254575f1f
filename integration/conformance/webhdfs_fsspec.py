"""fsspec's WebHDFS implementation against the cruise-sim WebHDFS simulator.

Usage: webhdfs_fsspec.py NAMENODE_URL SIM_ROOT
Against a real HDFS, SIM_ROOT is "-": bytes are read back through WebHDFS;
$CONFORMANCE_BASE (default /conformance) is where the files go.
"""
import os
import sys
from urllib.parse import urlparse

from fsspec.implementations.webhdfs import WebHDFS

NN, ROOT = sys.argv[1], sys.argv[2]
BASE = os.environ.get("CONFORMANCE_BASE", "/conformance") + "/fsspec"


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"  ok  {what}")


def on_disk(path):
    if ROOT == "-":
        return fs.cat_file(path)
    with open(os.path.join(ROOT, path.lstrip("/")), "rb") as f:
        return f.read()


u = urlparse(NN)
fs = WebHDFS(u.hostname, port=u.port, user="alice")

# status
info = fs.info("/")
check(info["type"] == "directory", "GETFILESTATUS / is a directory")

# mkdirs
fs.makedirs(f"{BASE}/dir", exist_ok=True)
check(fs.isdir(f"{BASE}/dir"), "MKDIRS")

# write / create: fsspec sends CREATE then APPENDs its buffer
with fs.open(f"{BASE}/a.txt", "wb") as f:
    f.write(b"hello world\n")
check(on_disk(f"{BASE}/a.txt") == b"hello world\n", "write (CREATE + APPEND) stored the bytes")
info = fs.info(f"{BASE}/a.txt")
check(info["type"] == "file" and info["size"] == 12 and info["owner"] == "alice",
      "GETFILESTATUS of the new file")

# append: fsspec writes by CREATE (empty) then one APPEND per flushed block;
# a small block size makes it APPEND several times. (Its "ab" mode is broken
# upstream: WebHDFile never sets the APPEND location, so it is not used.)
with fs.open(f"{BASE}/a.txt", "wb", block_size=5) as f:
    for part in (b"hello ", b"world\n", b"more\n"):
        f.write(part)
        f.flush()
check(on_disk(f"{BASE}/a.txt") == b"hello world\nmore\n", "several APPENDs added the bytes in order")

# read, whole and ranges (OPEN with offset and length)
check(fs.cat_file(f"{BASE}/a.txt") == b"hello world\nmore\n", "OPEN whole file")
check(fs.cat_file(f"{BASE}/a.txt", start=6, end=11) == b"world", "OPEN offset=6 length=5")
with fs.open(f"{BASE}/a.txt", "rb") as f:
    f.seek(12)
    check(f.read(4) == b"more", "buffered read after seek")

# list
names = sorted(os.path.basename(p) for p in fs.ls(BASE, detail=False))
check(names == ["a.txt", "dir"], "LISTSTATUS names")

# content summary
check(fs.content_summary(BASE)["length"] == 17, "GETCONTENTSUMMARY length")

# rename
fs.mv(f"{BASE}/a.txt", f"{BASE}/b.txt")
check(not fs.exists(f"{BASE}/a.txt") and fs.exists(f"{BASE}/b.txt"), "RENAME")
check(on_disk(f"{BASE}/b.txt") == b"hello world\nmore\n", "RENAME kept the bytes")

# delete
fs.rm(f"{BASE}/b.txt")
check(not fs.exists(f"{BASE}/b.txt"), "DELETE file")
fs.rm(BASE, recursive=True)
if ROOT == "-":
    check(not fs.exists(BASE), "DELETE recursive")
else:
    check(not os.path.exists(os.path.join(ROOT, BASE.lstrip("/"))), "DELETE recursive")

# 404
try:
    fs.info(f"{BASE}/missing")
    raise AssertionError("GETFILESTATUS of a missing path did not fail")
except FileNotFoundError:
    check(True, "404 maps to FileNotFoundError")

print("fsspec: all checks passed")
