"""Busy node (BENCHMARKS.md#busy-node-busy-benchbusypy): pluginsync beside another process that keeps ~1 GB unwritten.

A writer process (this file run as `busy.py writer FILE MIB`) keeps about MIB MiB of dirty page
cache on the filesystem of the agent's libdir: it writes FILE once without fsync, then, whenever
/proc/meminfo's Dirty falls below the target (a `syncfs` wrote it back, or the kernel's 30 s
expiry did), rewrites the next chunks of it, round and round, until SIGTERM. The bench removes FILE.

Figures, all in one run on one node per tool (a pluginsync node and an rsync daemon's node, both
already in sync, on the same filesystem as the writer's file):
  - sync calls of one no-op run: `strace -f -c -e trace=syncfs,fsync,fdatasync,sync,sync_file_range`
    (target: none);
  - the 1 % sync (30 files, bench/vendor/mutate.py), --busy-runs times quiet (a `sync` before each
    run, as the speed table does) and then with the writer running (no `sync`: its data is the
    point), for pluginsync and for the rsync daemon (`rsync -a --delete`), and the no-op run likewise;
  - Dirty (MiB) at the start of each busy run.
Targets: pluginsync's 1 % with the writer <= 2x its quiet 1 %, and <= 0.5x rsync's with the writer.

Imported by bench/run.py; stdlib and `strace` only.
"""
import os, signal, subprocess, sys, time

CHUNK = 16 << 20


def writer(path, mib):
    """The writer process: keeps ~mib MiB of path dirty until SIGTERM."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    size = mib << 20
    buf = os.urandom(CHUNK)  # incompressible, as a database's pages mostly are
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    pos = 0
    try:
        while not stop:
            if dirty_mib() < mib * 0.95:
                for _ in range(4):  # 64 MiB, then look again
                    os.pwrite(fd, buf, pos)
                    pos = (pos + CHUNK) % size
            else:
                time.sleep(0.05)
    finally:
        os.close(fd)


def dirty_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Dirty:"):
                return int(line.split()[1]) / 1024
    return 0.0


def wait_dirty(target_mib, limit=60.0):
    """Waits (at most `limit` s) until Dirty reaches ~target; returns Dirty then."""
    end = time.monotonic() + limit
    while dirty_mib() < target_mib * 0.9 and time.monotonic() < end:
        time.sleep(0.05)
    return dirty_mib()


def sync_calls(cmd, work):
    """Sync-family system calls of one run of cmd, from `strace -c` (0 when strace saw none)."""
    out = os.path.join(work, "strace.txt")
    traced = ["syncfs", "fsync", "fdatasync", "sync", "sync_file_range"]
    r = subprocess.run(["strace", "-f", "-c", "-o", out, "-e", "trace=" + ",".join(traced), *cmd],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode not in (0, 2):
        raise SystemExit(f"error: strace of a no-op run exited {r.returncode}: {r.stderr.strip()}")
    calls = {}
    with open(out) as f:
        for line in f:
            parts = line.split()
            if parts and parts[-1] in traced:
                # % time, seconds, usecs/call, calls, [errors], syscall
                calls[parts[-1]] = int(parts[3])
    os.remove(out)
    return calls


def run(ctx, results, timed, agent_cmd, rsync_cmd, node, rnode):
    """The busy-node figures into results["busy"]. `agent_cmd`/`rsync_cmd` sync the nodes `node`/`rnode`
    (both in sync with the master already); ctx.mutate() changes 1 % for both."""
    from common import log, stats
    a = ctx.a
    out = results.setdefault("busy", {})
    wfile = os.path.join(ctx.work, "busy-writer.dat")
    os.makedirs(node, exist_ok=True)
    if os.stat(ctx.work).st_dev != os.stat(node).st_dev:
        out["note"] = "not measured: the writer's file and the libdir are on different filesystems"
        return
    fstype = fs_type(node)
    out["filesystem"] = fstype
    if fstype in ("tmpfs", "ramfs"):
        out["note"] = f"not measured: the work directory is on {fstype}, which has no writeback (use --work on a disk)"
        return
    os.sync()
    timed(agent_cmd)  # both nodes in sync first
    timed(rsync_cmd)
    out["noop_sync_calls"] = sync_calls(agent_cmd, ctx.work)
    log(f"busy node: sync calls of a no-op run: {out['noop_sync_calls'] or 'none'}")
    q = {"pluginsync 1%": [], "rsync 1%": [], "pluginsync noop": [], "rsync noop": []}
    for i in range(a.busy_runs):
        log(f"busy node: quiet, run {i+1}/{a.busy_runs}")
        for tool, cmd in (("pluginsync", agent_cmd), ("rsync", rsync_cmd)):
            os.sync()
            q[f"{tool} noop"].append(timed(cmd))
        ctx.mutate()
        time.sleep(1.0)  # the master re-indexes (200 ms debounce); not timed
        for tool, cmd in (("pluginsync", agent_cmd), ("rsync", rsync_cmd)):
            os.sync()
            q[f"{tool} 1%"].append(timed(cmd))
    b = {k: [] for k in q}
    dirty = []
    log(f"busy node: starting a writer keeping ~{a.busy_mib} MiB dirty in {wfile}")
    w = subprocess.Popen([sys.executable, os.path.abspath(__file__), "writer", wfile, str(a.busy_mib)])
    try:
        d0 = wait_dirty(a.busy_mib)
        log(f"busy node: Dirty {d0:.0f} MiB")
        for i in range(a.busy_runs):
            log(f"busy node: writer running, run {i+1}/{a.busy_runs}")
            for tool, cmd in (("pluginsync", agent_cmd), ("rsync", rsync_cmd)):
                dirty.append(wait_dirty(a.busy_mib))
                b[f"{tool} noop"].append(timed(cmd))
            ctx.mutate()
            time.sleep(1.0)
            for tool, cmd in (("pluginsync", agent_cmd), ("rsync", rsync_cmd)):
                dirty.append(wait_dirty(a.busy_mib))
                b[f"{tool} 1%"].append(timed(cmd))
    finally:
        w.terminate()
        w.wait(30)
        try:
            os.remove(wfile)
        except FileNotFoundError:
            pass
    os.sync()
    out["writer_mib"] = a.busy_mib
    out["dirty_mib_at_start"] = stats(dirty)
    out["quiet"] = {k: stats(v) for k, v in q.items()}
    out["busy"] = {k: stats(v) for k, v in b.items()}
    m = lambda d, k: d[k]["median"]
    out["ratio_busy_to_quiet_1%"] = m(out["busy"], "pluginsync 1%") / m(out["quiet"], "pluginsync 1%")
    out["ratio_to_rsync_busy_1%"] = m(out["busy"], "pluginsync 1%") / m(out["busy"], "rsync 1%")
    out["ratio_to_rsync_busy_noop"] = m(out["busy"], "pluginsync noop") / m(out["busy"], "rsync noop")


def fs_type(path):
    """The type of the filesystem holding path, from /proc/self/mounts (longest mount point)."""
    path = os.path.realpath(path)
    best, kind = "", "?"
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            mnt = parts[1].replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                best, kind = mnt, parts[2]
    return kind


def print_table(r):
    b = r.get("busy")
    if not b:
        return
    if "note" in b:
        print(f"\nBusy node: {b['note']}")
        return
    from common import fmt_s
    print(f"\n| busy node ({b['filesystem']}; a writer keeping ~{b['writer_mib']} MiB dirty, Dirty at run start "
          f"median {b['dirty_mib_at_start']['median']:.0f} MiB) | quiet median (min–max) | writer running | busy / quiet |")
    print("|---|---|---|---|")
    for k in ("pluginsync noop", "rsync noop", "pluginsync 1%", "rsync 1%"):
        qq, bb = b["quiet"][k], b["busy"][k]
        print(f"| {k} | {fmt_s(qq['median'])} ({fmt_s(qq['min'])}–{fmt_s(qq['max'])}) | "
              f"{fmt_s(bb['median'])} ({fmt_s(bb['min'])}–{fmt_s(bb['max'])}) | {bb['median']/qq['median']:.2f}× |")
    calls = b["noop_sync_calls"]
    print(f"\nsync calls of one no-op pluginsync run (strace -c): "
          + (", ".join(f"{k} {v}" for k, v in calls.items()) if calls else "none"))
    print(f"with the writer: pluginsync / rsync = {b['ratio_to_rsync_busy_1%']:.2f}× (1 %), "
          f"{b['ratio_to_rsync_busy_noop']:.2f}× (no-op); pluginsync 1 % busy / quiet = {b['ratio_busy_to_quiet_1%']:.2f}×")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "writer":
        writer(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit("usage: busy.py writer FILE MIB")
