"""Hundreds of environments (BENCHMARKS.md#hundreds-of-environments-envs-benchenvspy): one master, --envs environments that differ by 1 %.

The environments are what r10k makes of one repository's branches: full copies of the default tree
(bench/vendor/gen_tree.py, the bench's --files/--modules/--seed), environment i changed by 1 % with
its own seed (bench/vendor/mutate.py --seed 1000+i), so each differs from the others in ~30 files.
They live under /dev/shm (tmpfs; ~25 MB each) and are removed at the end.

Figures:
  - full index of one environment: master CPU from its start until it has answered both listings
    of its only environment once (a master of its own, on a copy of environment 0);
  - ready: seconds from starting the master on all of them until `GET /status/v1/simple` answers
    200 `running` (polled every 20 ms; docs/protocol.md §1.9), and its CPU and RSS then;
  - RSS after both listings of every environment were asked for once (one keep-alive connection
    with the node's certificate, gzip accepted, as an agent asks), and the time that took;
  - re-index after a 1 % change in one environment: master CPU for `pluginsync-master reindex ENV`
    (its answer waits for the new index, docs/protocol.md §1.10), for the same call on an unchanged
    environment, and for the changed environment's listings asked for once afterwards.
Targets: ready <= 10 s, RSS <= 256 MiB, re-index of the 1 % change <= 0.1x the full index of one
environment (the bench's reading of "costs what that environment's changed files cost": the walk
may remain, re-reading and re-serialising the unchanged 99 % may not).

Imported by bench/run.py.
"""
import http.client, os, ssl, subprocess, sys, tempfile, time

from common import (LISTING_QUERY, MASTER, cpu_between, free_port, https_conn, https_get, log, master_config,
                    procs, reindex, rmtree, rss, start_master, stop, thread_cpu, tls_context, wait_idle)

HEADERS = {"Accept": "application/json, text/pson", "Accept-Encoding": "gzip"}


def query_env(conn, env):
    for mount in ("plugins", "pluginfacts"):
        status, _ = https_get(conn, f"/puppet/v3/file_metadatas/{mount}?{LISTING_QUERY}&environment={env}", HEADERS)
        if status != 200:
            raise SystemExit(f"error: listing {mount} of environment {env} answered {status}")


def name(i):
    return f"env{i:03d}"


def make(ctx, root, n):
    """n environments under root/envs, made from a freshly generated default tree."""
    envs = os.path.join(root, "envs")
    base = os.path.join(envs, name(0))
    a = ctx.a
    subprocess.run([sys.executable, ctx.gen, "--out", base, "--files", str(a.files), "--modules", str(a.modules),
                    "--seed", str(a.seed)], check=True, stdout=subprocess.DEVNULL)
    for i in range(1, n):
        subprocess.run(["cp", "-a", base, os.path.join(envs, name(i))], check=True)
    for i in range(n):
        subprocess.run([sys.executable, ctx.mutate_py, os.path.join(envs, name(i)), "--layout", "env",
                        "--percent", "1", "--seed", str(1000 + i), "--rev", "1"], check=True, stdout=subprocess.DEVNULL)
    return envs


def full_index_of_one(ctx, root, envs):
    """Master CPU to index one environment whole and answer its listings once."""
    one = os.path.join(root, "one")
    os.makedirs(one)
    subprocess.run(["cp", "-a", os.path.join(envs, name(0)), os.path.join(one, name(0))], check=True)
    conf = os.path.join(root, "one.toml")
    master_config(conf, one, ctx.ssl, publish="explicit")
    m, port = start_master(conf)
    try:
        conn = https_conn(port, tls_context(ctx.ssl, "bench-node"))
        query_env(conn, name(0))
        conn.close()
        wait_idle(m.pid)
        return cpu_between({}, thread_cpu(m.pid))
    finally:
        stop(m)
        rmtree(one)


def status_ok(port):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=2)
        c.request("GET", "/status/v1/simple")
        r = c.getresponse()
        ok = r.status == 200 and r.read() == b"running"
        c.close()
        return ok
    except (OSError, http.client.HTTPException):
        return False


def run(ctx, results):
    a = ctx.a
    n = a.envs
    out = results.setdefault("envs", {"count": n})
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    root = tempfile.mkdtemp(prefix="pluginsync-bench-envs-", dir=shm)
    ctx.cleanup.append(root)
    try:
        log(f"{n} environments: making them in {root}")
        t = time.perf_counter()
        envs = make(ctx, root, n)
        out["make_s"] = time.perf_counter() - t
        log("environments: the full index of one environment")
        out["full_index_one_env_cpu_s"] = full_index_of_one(ctx, root, envs)
        conf = os.path.join(root, "master.toml")
        port = free_port()
        master_config(conf, envs, ctx.ssl, listen=f"127.0.0.1:{port}", publish="explicit")
        os.sync()
        log(f"environments: starting a master on all {n}")
        t0 = time.perf_counter()
        m = subprocess.Popen([MASTER, "serve", "--config", conf], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        procs.append(m)
        deadline = t0 + 600
        while not status_ok(port):
            if m.poll() is not None:
                raise SystemExit(f"error: the master on {n} environments exited {m.returncode}")
            if time.perf_counter() > deadline:
                raise SystemExit(f"error: the master on {n} environments was not ready after 600 s")
            time.sleep(0.02)
        out["ready_s"] = time.perf_counter() - t0
        out["cpu_at_ready_s"] = cpu_between({}, thread_cpu(m.pid))
        out["rss_at_ready"] = rss(m.pid)
        log(f"environments: ready after {out['ready_s']:.2f} s; asking every environment's listings once")
        t = time.perf_counter()
        conn = https_conn(port, tls_context(ctx.ssl, "bench-node"))
        for i in range(n):
            query_env(conn, name(i))
        out["query_all_s"] = time.perf_counter() - t
        wait_idle(m.pid)
        out["rss_after_all"] = rss(m.pid)
        out["cpu_after_all_s"] = cpu_between({}, thread_cpu(m.pid))
        # Re-index: one environment changed by 1 % (its own 30 files again, a new revision).
        changed, unchanged = name(n // 2), name(n // 2 + 1 if n > 1 else 0)
        subprocess.run([sys.executable, ctx.mutate_py, os.path.join(envs, changed), "--layout", "env", "--percent",
                        "1", "--seed", str(1000 + n // 2), "--rev", "2"], check=True, stdout=subprocess.DEVNULL)
        for key, env in (("reindex_unchanged_cpu_s", unchanged), ("reindex_1pct_cpu_s", changed)):
            wait_idle(m.pid)
            c0 = thread_cpu(m.pid)
            reindex(conf, port, env)
            wait_idle(m.pid)
            out[key] = cpu_between(c0, thread_cpu(m.pid))
        c0 = thread_cpu(m.pid)
        query_env(conn, changed)
        wait_idle(m.pid)
        out["listings_after_reindex_cpu_s"] = cpu_between(c0, thread_cpu(m.pid))
        conn.close()
        out["rss_end"] = rss(m.pid)
        out["reindex_ratio"] = out["reindex_1pct_cpu_s"] / out["full_index_one_env_cpu_s"]
        stop(m)
    finally:
        rmtree(root)


def print_table(r):
    e = r.get("envs")
    if not e or "ready_s" not in e:
        return
    ms = lambda x: f"{x*1000:.0f} ms"
    print(f"\n| {e['count']} environments, each the default tree changed by 1 % | value |")
    print("|---|---|")
    print(f"| start to `/status/v1/simple` answering `running` | {e['ready_s']:.2f} s "
          f"(master CPU {e['cpu_at_ready_s']:.2f} s, RSS {e['rss_at_ready'].get('VmRSS')} MiB) |")
    print(f"| RSS after both listings of every environment asked once | {e['rss_after_all'].get('VmRSS')} MiB "
          f"(peak {e['rss_after_all'].get('VmHWM')} MiB; asking took {e['query_all_s']:.2f} s) |")
    print(f"| full index of one environment (a master of its own) | {ms(e['full_index_one_env_cpu_s'])} CPU |")
    print(f"| re-index after a 1 % change in one environment | {ms(e['reindex_1pct_cpu_s'])} CPU "
          f"({e['reindex_ratio']:.2f}× the full index) |")
    print(f"| re-index of an unchanged environment | {ms(e['reindex_unchanged_cpu_s'])} CPU |")
    print(f"| the changed environment's listings, first asked after its re-index | "
          f"{ms(e['listings_after_reindex_cpu_s'])} CPU |")
