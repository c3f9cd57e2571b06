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
  - the generation store (`[generations] dir` under the work directory, docs/deploys.md#generations):
    its blob and manifest bytes once every environment is published, against one tree (the distinct
    contents of the default tree's `lib/` and `facts.d/` files) plus the differences (the distinct
    contents every 1 % change wrote): the store holds identical files once;
  - keep generations: every environment published --envs-keep (`[generations] keep`, default 5)
    times in all, a 1 % change between (its own files again, revisions 101, 102, …; the re-indexed
    environment above has one more, so its oldest is evicted), then every environment's per-node
    answer, its manifest and both listings asked once: the master's RSS and peak RSS, and the
    store's bytes against one tree plus every difference.
Targets: ready <= 10 s, RSS <= 256 MiB (with one generation each, and with keep generations each),
re-index of the 1 % change <= 0.1x the full index of one environment (the bench's reading of "costs
what that environment's changed files cost": the walk may remain, re-reading and re-serialising the
unchanged 99 % may not), store bytes <= 1.1x one tree plus the differences.

Imported by bench/run.py.
"""
import hashlib, http.client, json, os, ssl, subprocess, sys, tempfile, time

from common import (LISTING_QUERY, MASTER, MASTER_ENV, cpu_between, free_port, https_conn, https_get, log, master_config,
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
    contents = Contents(base)
    for i in range(n):
        contents.mutate(ctx, os.path.join(envs, name(i)), 1000 + i, 1)
    return envs, contents


class Contents:
    """The distinct file contents the environments' mounts have held (by sha256): what an ideal
    content-addressed store of every generation holds. `tree` is the default tree's bytes, `diffs`
    the bytes of contents the 1 % changes made that no earlier tree had."""

    def __init__(self, base):
        self.seen, self.tree, self.diffs = set(), 0, 0
        for mod in os.listdir(os.path.join(base, "modules")):
            for mount in ("lib", "facts.d"):
                for dp, _, fn in os.walk(os.path.join(base, "modules", mod, mount)):
                    for f in fn:
                        self.tree += self.add(os.path.join(dp, f))

    def add(self, path):
        with open(path, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).digest()
        if digest in self.seen:
            return 0
        self.seen.add(digest)
        return len(data)

    def mutate(self, ctx, env, seed, rev):
        """bench/vendor/mutate.py on `env` (its plugin files, first module wins); counts the new contents."""
        r = subprocess.run([sys.executable, ctx.mutate_py, env, "--layout", "env", "--percent", "1", "--seed",
                            str(seed), "--rev", str(rev), "--list"], check=True, stdout=subprocess.PIPE, text=True)
        mods = sorted(os.listdir(os.path.join(env, "modules")))
        for rel in r.stdout.splitlines()[1:]:
            for mod in mods:
                p = os.path.join(env, "modules", mod, "lib", rel)
                if os.path.isfile(p):
                    self.diffs += self.add(p)
                    break


def store_bytes(store):
    """{blobs, manifests}: bytes of the files of a generation store (docs/deploys.md#generations)."""
    out = {}
    for part in ("blobs", "manifests"):
        total = 0
        for dp, _, fn in os.walk(os.path.join(store, part)):
            total += sum(os.path.getsize(os.path.join(dp, f)) for f in fn)
        out[part] = total
    return out


def ask_generation(conn, env):
    """The per-node answer of `env` and its generation's manifest, as an agent asks (docs/protocol.md §7.6)."""
    status, body = https_get(conn, f"/pluginsync/v1/assignment?environment={env}", {"Accept": "application/json"})
    if status != 200:
        raise SystemExit(f"error: the per-node answer of environment {env} answered {status}")
    gen = json.loads(body)["generation"]
    status, _ = https_get(conn, f"/pluginsync/v1/generations/{gen}?environment={env}",
                          {"Accept": "application/x-pluginsync-manifest"})
    if status != 200:
        raise SystemExit(f"error: the manifest of environment {env}'s generation answered {status}")


def keep_generations(ctx, out, conf, port, m, envs, contents, store):
    """Every environment published --envs-keep times in all, a 1 % change between; then RSS and the store."""
    a = ctx.a
    t = time.perf_counter()
    for k in range(1, a.envs_keep):
        log(f"environments: generation {k + 1} of {a.envs_keep} of each")
        for i in range(a.envs):
            contents.mutate(ctx, os.path.join(envs, name(i)), 1000 + i, 100 + k)
            reindex(conf, port, name(i))
    out["keep_publish_s"] = time.perf_counter() - t
    conn = https_conn(port, tls_context(ctx.ssl, "bench-node"))
    for i in range(a.envs):
        ask_generation(conn, name(i))
        query_env(conn, name(i))
    conn.close()
    wait_idle(m.pid)
    out["keep"] = a.envs_keep
    out["rss_keep"] = rss(m.pid)
    out["store_keep"] = store_bytes(store)
    out["tree_bytes"], out["diff_bytes_keep"] = contents.tree, contents.diffs


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
        envs, contents = make(ctx, root, n)
        out["tree_bytes"], out["diff_bytes_ready"] = contents.tree, contents.diffs
        out["make_s"] = time.perf_counter() - t
        log("environments: the full index of one environment")
        out["full_index_one_env_cpu_s"] = full_index_of_one(ctx, root, envs)
        conf = os.path.join(root, "master.toml")
        port = free_port()
        store = os.path.join(root, "store")
        master_config(conf, envs, ctx.ssl, listen=f"127.0.0.1:{port}", publish="explicit",
                      extra=f'[generations]\ndir = "{store}"\nkeep = {a.envs_keep}\n')
        os.sync()
        log(f"environments: starting a master on all {n}")
        t0 = time.perf_counter()
        m = subprocess.Popen([MASTER, "serve", "--config", conf], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=MASTER_ENV)
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
        # Each environment is indexed, and so published, when first asked for.
        out["store_ready"] = store_bytes(store)
        out["cpu_after_all_s"] = cpu_between({}, thread_cpu(m.pid))
        # Re-index: one environment changed by 1 % (its own 30 files again, a new revision).
        changed, unchanged = name(n // 2), name(n // 2 + 1 if n > 1 else 0)
        contents.mutate(ctx, os.path.join(envs, changed), 1000 + n // 2, 2)
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
        if a.envs_keep > 1:
            keep_generations(ctx, out, conf, port, m, envs, contents, store)
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
    mb = lambda x: f"{x / 1e6:,.1f} MB"
    if "store_ready" in e:
        st = e["store_ready"]
        print(f"| generation store, one generation each: blobs / manifests | {mb(st['blobs'])} / "
              f"{mb(st['manifests'])} (one tree {mb(e['tree_bytes'])} + differences "
              f"{mb(e['diff_bytes_ready'])}: {store_ratio(e, 'ready'):.2f}×) |")
    if "rss_keep" in e:
        st = e["store_keep"]
        print(f"| {e['keep']} generations each ({e['keep_publish_s']:.0f} s to publish them): RSS after every "
              f"answer, manifest and listing asked once | {e['rss_keep'].get('VmRSS')} MiB "
              f"(peak {e['rss_keep'].get('VmHWM')} MiB) |")
        print(f"| {e['keep']} generations each: store blobs / manifests | {mb(st['blobs'])} / {mb(st['manifests'])} "
              f"(one tree {mb(e['tree_bytes'])} + differences {mb(e['diff_bytes_keep'])}: "
              f"{store_ratio(e, 'keep'):.2f}×) |")


def store_ratio(e, when):
    """The store's blob bytes over one tree plus the differences made by then."""
    return e[f"store_{when}"]["blobs"] / (e["tree_bytes"] + e[f"diff_bytes_{when}"])
