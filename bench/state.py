"""The fleet state store (BENCHMARKS.md#the-state-store-state-benchstatepy): two replicas sharing one
PostgreSQL against the embedded store, in one run (docs/operating.md#the-state-store).

The nodes are simulated: --state-nodes distinct certnames (`bench-000000`, …), each doing one node run
as pluginsync's agent does its first (docs/protocol.md §7.6, §7.8): the per-node answer for
`production` (`GET /pluginsync/v1/assignment`, with the `X-Pluginsync-Report` header of a node that has
committed nothing yet), then, after its commit, its node report (`POST /pluginsync/v1/report`, the body
naming the generation just served). They reach the masters through the `[proxy]` listener
(docs/protocol.md §5.5: plain HTTP, the identity from `X-Client-Verify: SUCCESS` and
`X-Client-DN: CN=<certname>`), as behind a balancer: --state-concurrency client threads (default 32),
each on one kept-alive connection to one replica (thread i to replica i mod R), taking the next node
when done. The environment is a small tree of its own (one module, 20 plugin files): what is measured
is the state, not the files.

Setups, in this order, each with fresh masters and stores:
  embedded       one master, the embedded SQLite store (the baseline);
  embedded x2    two masters, each its own embedded store (a second reference: no sharing);
  postgresql x2  two replicas on one PostgreSQL (`[state] url`), then the inventory phase below.
The PostgreSQL is a throwaway one (Debian's server, /usr/lib/postgresql/*/bin): `initdb` as `nobody`
(it refuses root) into a directory of its own under /tmp, loopback on a free port, `fsync`, `synchronous_commit` and
`full_page_writes` left at their defaults (on: what a production database runs with).

Figures:
  - master CPU per node run: the masters' user+system CPU (/proc/<pid>/stat, every thread, exited ones
    too) from just before the first request until the last report is written (the store's writer
    flushes at most 200 ms later: the bench waits until every node is in the store and the masters are
    idle), summed over the replicas, divided by the nodes; wall time of the run; with PostgreSQL, the
    database's CPU (the postmaster and every backend: live ones' own, exited ones' through the
    postmaster's reaped-children counters) stated apart. Target: PostgreSQL <= 1.1x embedded;
  - RSS growth for --state-inventory-nodes nodes: each replica's VmRSS / VmHWM once started (before any
    node) and after that many distinct nodes ran once (the first --state-nodes included). Target:
    <= 64 MiB each;
  - `pluginsync-master inventory` against one replica over all those nodes: wall time, median of 3,
    the default table and `--format json` (which pages through the whole fleet). Target: <= 1 s;
  - the database's size per node: `pg_total_relation_size` of every table (indexes and TOAST included)
    divided by the nodes in `node_reports`; for the embedded store, the SQLite file (and its -wal)
    divided by --state-nodes.

Imported by bench/run.py.
"""
import glob, http.client, json, os, re, shutil, statistics, subprocess, tempfile, threading, time

from common import (MASTER, MASTER_ENV, cpu_seconds, free_port, log, master_config, procs, rss, start, stop,
                    wait_port)

HEADERS = {"X-Client-Verify": "SUCCESS", "Accept": "application/json"}
# The header a node that has committed nothing yet sends on its per-node request (docs/protocol.md §7.8).
FIRST_REPORT = '{"loads_ok":0,"loads_failed":0}'
CPU_TARGET, RSS_TARGET_MIB, INVENTORY_TARGET_S = 1.1, 64, 1.0


def pg_bin():
    """Debian's newest PostgreSQL server binaries, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    return os.path.dirname(found[-1]) if found else None


def as_nobody(cmd):
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] + cmd if os.geteuid() == 0 else cmd


class Postgres:
    """A throwaway PostgreSQL as `nobody` in `dir`, on a loopback port (fsync on, the default)."""

    def __init__(self, bindir, dir):
        self.bin, self.dir, self.port = bindir, dir, free_port()
        os.makedirs(f"{dir}/sock")
        if os.geteuid() == 0:
            for root, dirs, files in os.walk(dir):
                for p in [root] + [os.path.join(root, f) for f in dirs + files]:
                    os.lchown(p, 65534, 65534)
        subprocess.run(as_nobody([f"{bindir}/initdb", "-D", f"{dir}/data", "-U", "postgres", "--auth=trust",
                                  "-E", "UTF8", "--no-locale"]), check=True, stdout=subprocess.DEVNULL)
        log(f"starting PostgreSQL on 127.0.0.1:{self.port} (fsync on)")
        self.proc = subprocess.Popen(as_nobody([f"{bindir}/postgres", "-D", f"{dir}/data", "-p", str(self.port),
                                                "-k", f"{dir}/sock", "-c", "listen_addresses=127.0.0.1",
                                                "-c", "max_connections=100"]),
                                     stdout=subprocess.DEVNULL, stderr=open(f"{dir}/postgres.log", "w"))
        procs.append(self.proc)
        end = time.time() + 60
        while subprocess.run([f"{bindir}/pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)]).returncode:
            if time.time() > end or self.proc.poll() is not None:
                raise SystemExit(f"error: PostgreSQL did not start: {open(f'{dir}/postgres.log').read()[-500:]}")
            time.sleep(0.2)
        self.sql("CREATE DATABASE pluginsync", db="postgres")

    def url(self):
        return f"postgresql://postgres@127.0.0.1:{self.port}/pluginsync?sslmode=disable"

    def sql(self, q, db="pluginsync"):
        r = subprocess.run([f"{self.bin}/psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p",
                            str(self.port), "-U", "postgres", "-d", db, "-c", q], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"error: psql {q!r}: {r.stderr.strip()}")
        return r.stdout.strip()

    def cpu_s(self):
        """CPU seconds of the postmaster and its backends so far (reaped ones through cutime/cstime)."""
        tick = os.sysconf("SC_CLK_TCK")
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total = sum(int(x) for x in fields[11:15]) / tick
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                with open(stat) as f:
                    fl = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fl[1]) == self.proc.pid:
                total += (int(fl[11]) + int(fl[12])) / tick
        return total

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT: PostgreSQL's fast shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def make_env(envs):
    """A small production environment: one module, 20 plugin files."""
    lib = os.path.join(envs, "production", "modules", "benchstate", "lib", "facter")
    os.makedirs(lib)
    for i in range(20):
        with open(os.path.join(lib, f"fact{i:02}.rb"), "w") as f:
            f.write(f"Facter.add(:bench_state_{i}) do\n  setcode {{ '{i}' }}\nend\n")


def start_replica(ctx, name, envs, state_url=None):
    """One master with a [proxy] listener on a port of its own; returns {proc, port, proxy, conf, gens}."""
    work = os.path.join(ctx.work, "state", name)
    os.makedirs(work)
    proxy = free_port()
    gens = os.path.join(work, "generations")
    extra = (f'[proxy]\nlisten = ["127.0.0.1:{proxy}"]\ntrusted = ["127.0.0.1"]\n'
             f'[generations]\ndir = "{gens}"\n' + (f'[state]\nurl = "{state_url}"\n' if state_url else ""))
    conf = os.path.join(work, "master.toml")
    master_config(conf, envs, ctx.ssl, extra=extra)
    p, m = start([MASTER, "serve", "--config", conf],
                 lambda l: "proxy listening" not in l and re.search(r"listening on 127\.0\.0\.1:(\d+)", l),
                 timeout=120, env=MASTER_ENV)
    wait_port(proxy)
    end = time.time() + 60
    while True:  # ready: the environment indexed and a generation published
        c = http.client.HTTPConnection("127.0.0.1", proxy, timeout=30)
        c.request("GET", "/status/v1/simple")
        r = c.getresponse()
        body = r.read()
        c.close()
        if r.status == 200 and body.strip() == b"running":
            break
        if time.time() > end:
            raise SystemExit(f"error: master {name} not running after 60 s: {r.status} {body[:200]!r}")
        time.sleep(0.1)
    return {"proc": p, "port": int(m.group(1)), "proxy": proxy, "conf": conf, "gens": gens, "name": name}


def node_runs(replicas, first, count, threads):
    """Nodes first..first+count-1 each do one node run; returns (wall seconds, errors)."""
    lock = threading.Lock()
    nxt = [first]
    errors = []

    def worker(i):
        port = replicas[i % len(replicas)]["proxy"]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while True:
            with lock:
                n = nxt[0]
                if n >= first + count:
                    break
                nxt[0] += 1
            h = {**HEADERS, "X-Client-DN": f"CN=bench-{n:06}"}
            try:
                conn.request("GET", "/pluginsync/v1/assignment?environment=production",
                             headers={**h, "X-Pluginsync-Report": FIRST_REPORT})
                r = conn.getresponse()
                body = r.read()
                if r.status != 200:
                    raise RuntimeError(f"assignment {r.status}: {body[:200]!r}")
                gen = json.loads(body)["generation"]
                report = json.dumps({"generation": gen, "loads_ok": 20, "loads_failed": 0}, separators=(",", ":"))
                conn.request("POST", "/pluginsync/v1/report?environment=production", body=report,
                             headers={**h, "Content-Type": "text/plain"})
                r = conn.getresponse()
                body = r.read()
                if r.status != 204:
                    raise RuntimeError(f"report {r.status}: {body[:200]!r}")
            except (OSError, RuntimeError, http.client.HTTPException, ValueError, KeyError) as e:
                with lock:
                    errors.append(str(e))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.close()

    t = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return time.perf_counter() - t, errors


def settle(replicas, stored, want, limit=120):
    """Waits until `stored()` counts `want` nodes (the writers flushed), then until the masters idle."""
    end = time.time() + limit
    while stored() < want:
        if time.time() > end:
            raise SystemExit(f"error: {stored()} of {want} nodes in the store after {limit} s")
        time.sleep(0.1)
    for _ in range(50):  # idle: no CPU tick in 200 ms
        before = sum(cpu_seconds(r["proc"].pid) for r in replicas)
        time.sleep(0.2)
        if sum(cpu_seconds(r["proc"].pid) for r in replicas) == before:
            return


def sqlite_count(path):
    import sqlite3
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as c:
            return c.execute("SELECT count(*) FROM node_reports").fetchone()[0]
    except sqlite3.Error:
        return 0


def measured_run(replicas, nodes, threads, stored, pg=None):
    """The timed run of `nodes` node runs; the masters' (and the database's) CPU, wall time, errors."""
    cpu0 = [cpu_seconds(r["proc"].pid) for r in replicas]
    db0 = pg.cpu_s() if pg else None
    wall, errors = node_runs(replicas, 0, nodes, threads)
    settle(replicas, stored, nodes)
    cpu = [cpu_seconds(r["proc"].pid) - c for r, c in zip(replicas, cpu0)]
    if errors:
        raise SystemExit(f"error: {len(errors)} of {nodes} node runs failed, the first: {errors[0]}")
    out = {"nodes": nodes, "wall_s": wall, "master_cpu_s": cpu, "cpu_per_node_s": sum(cpu) / nodes,
           "rate": nodes / wall}
    if pg:
        out["db_cpu_s"] = pg.cpu_s() - db0
        out["db_cpu_per_node_s"] = out["db_cpu_s"] / nodes
    return out


def embedded(ctx, envs, name, count, results):
    a = ctx.a
    reps = [start_replica(ctx, f"{name}-{i}", envs) for i in range(count)]
    files = [os.path.join(r["gens"], "state", "pluginsync.sqlite") for r in reps]
    log(f"state: {a.state_nodes:,} node runs, {name} ({count} master{'s' * (count > 1)})")
    out = measured_run(reps, a.state_nodes, a.state_concurrency, lambda: sum(sqlite_count(f) for f in files))
    out["rss"] = [rss(r["proc"].pid) for r in reps]
    for r in reps:
        stop(r["proc"])
    # Measured once the masters stopped: closing checkpoints the -wal into the file.
    size = sum(os.path.getsize(f + s) for f in files for s in ("", "-wal") if os.path.exists(f + s))
    out["store_bytes"], out["bytes_per_node"] = size, size / a.state_nodes
    results[name] = out


def inventory_times(rep, fmt):
    """Wall seconds of `pluginsync-master inventory` against `rep`, 3 times; and its output's size."""
    times, size = [], 0
    for _ in range(3):
        t = time.perf_counter()
        r = subprocess.run([MASTER, "inventory", "--config", rep["conf"], "--master", f"https://localhost:{rep['port']}",
                            "--format", fmt], capture_output=True, text=True)
        times.append(time.perf_counter() - t)
        if r.returncode:
            raise SystemExit(f"error: pluginsync-master inventory exited {r.returncode}: {r.stderr.strip()}")
        size = len(r.stdout)
    return {"median_s": statistics.median(times), "runs": times, "output_bytes": size}


def postgresql(ctx, envs, results):
    a = ctx.a
    # A directory of its own under /tmp: `nobody` cannot enter the work directory (0700, root's).
    pgdir = tempfile.mkdtemp(prefix="pluginsync-bench-pg-", dir="/tmp")
    pg = None
    try:
        pg = Postgres(pg_bin(), pgdir)
        reps = [start_replica(ctx, f"pg-{i}", envs, pg.url()) for i in range(2)]
        stored = lambda: int(pg.sql("SELECT count(*) FROM node_reports") or 0)
        out = {"rss_start": [rss(r["proc"].pid) for r in reps]}
        log(f"state: {a.state_nodes:,} node runs, two replicas on PostgreSQL")
        out.update(measured_run(reps, a.state_nodes, a.state_concurrency, stored, pg))
        rest = a.state_inventory_nodes - a.state_nodes
        if rest > 0:
            log(f"state: {rest:,} more nodes for the inventory")
            wall, errors = node_runs(reps, a.state_nodes, rest, a.state_concurrency)
            if errors:
                raise SystemExit(f"error: {len(errors)} of {rest} node runs failed, the first: {errors[0]}")
            out["inventory_fill_s"] = wall
        inv = max(a.state_inventory_nodes, a.state_nodes)
        settle(reps, stored, inv, limit=600)
        out["inventory_nodes"] = inv
        out["rss_after"] = [rss(r["proc"].pid) for r in reps]
        log(f"state: pluginsync-master inventory over {inv:,} nodes")
        out["inventory_table"] = inventory_times(reps[0], "text")
        out["inventory_json"] = inventory_times(reps[0], "json")
        sizes = pg.sql("SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n "
                       "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'")
        out["db_tables"] = {k: int(v) for k, v in (l.split("|") for l in sizes.splitlines() if l)}
        out["db_bytes"] = sum(out["db_tables"].values())
        out["db_nodes"] = stored()
        out["db_served_rows"] = int(pg.sql("SELECT count(*) FROM served"))
        out["db_bytes_per_node"] = out["db_bytes"] / out["db_nodes"]
        for r in reps:
            stop(r["proc"])
    finally:
        if pg:
            pg.stop()
        shutil.rmtree(pgdir, ignore_errors=True)
    results["postgresql x2"] = out


def run(ctx, results):
    if not pg_bin():
        raise SystemExit("PostgreSQL is not installed (apt-get install postgresql): the state scenario needs it")
    envs = os.path.join(ctx.work, "state", "envs")
    make_env(envs)
    st = results["state"] = {"nodes": ctx.a.state_nodes, "concurrency": ctx.a.state_concurrency}
    embedded(ctx, envs, "embedded", 1, st)
    embedded(ctx, envs, "embedded x2", 2, st)
    postgresql(ctx, envs, st)
    st["cpu_ratio"] = st["postgresql x2"]["cpu_per_node_s"] / st["embedded"]["cpu_per_node_s"]
    st["cpu_ratio_x2"] = st["postgresql x2"]["cpu_per_node_s"] / st["embedded x2"]["cpu_per_node_s"]
    shutil.rmtree(os.path.join(ctx.work, "state"), ignore_errors=True)


def print_table(r):
    s = r.get("state")
    if not s or "postgresql x2" not in s:
        return
    ms = lambda x: f"{x*1000:.3f} ms"
    print(f"\n| {s['nodes']:,} node runs through the [proxy] listener, {s['concurrency']} client threads | "
          "master CPU per node run | wall time | node runs/s | database CPU per node run | store per node |")
    print("|---|---|---|---|---|---|")
    for k in ("embedded", "embedded x2", "postgresql x2"):
        v = s[k]
        db = ms(v["db_cpu_per_node_s"]) if "db_cpu_per_node_s" in v else "–"
        per = v.get("bytes_per_node", v.get("db_bytes_per_node"))
        print(f"| {k} | {ms(v['cpu_per_node_s'])} ({' + '.join(f'{c:.2f}' for c in v['master_cpu_s'])} s) | "
              f"{v['wall_s']:.1f} s | {v['rate']:,.0f} | {db} | {per:,.0f} B |")
    p = s["postgresql x2"]
    print(f"\nmaster CPU per node run, PostgreSQL x2 / embedded: {s['cpu_ratio']:.2f}×; "
          f"/ embedded x2: {s['cpu_ratio_x2']:.2f}×")
    print(f"\n| two replicas on PostgreSQL, {p['inventory_nodes']:,} nodes | replica 0 | replica 1 |")
    print("|---|---|---|")
    print("| RSS at start / after (peak) | " + " | ".join(
        f"{b['VmRSS']} / {e['VmRSS']} MiB ({e['VmHWM']} MiB)" for b, e in zip(p["rss_start"], p["rss_after"])) + " |")
    t, j = p["inventory_table"], p["inventory_json"]
    print(f"\n`pluginsync-master inventory` over {p['inventory_nodes']:,} nodes: table {t['median_s']:.2f} s, "
          f"--format json {j['median_s']:.2f} s ({j['output_bytes']/1e6:.1f} MB) (medians of 3)")
    print(f"database: {p['db_bytes']/1e6:.1f} MB for {p['db_nodes']:,} nodes ({p['db_bytes_per_node']:,.0f} B a node; "
          + ", ".join(f"{k} {v/1e6:.1f} MB" for k, v in sorted(p["db_tables"].items(), key=lambda kv: -kv[1])[:3])
          + f"; {p['db_served_rows']:,} served rows)")


def targets(r, add):
    """The state store's rows of the Targets table (bench/run.py `targets`)."""
    s = r.get("state", {})
    p = s.get("postgresql x2", {})
    # The target: "the same run with the embedded store", i.e. the
    # same 10,000 node runs through two masters, each on its embedded
    # store; one master embedded (all the load in one process) is shown
    # beside it, as it was the target until this reading.
    add(f"state store: master CPU per node run, two replicas on PostgreSQL ≤ {CPU_TARGET}× the same run "
        "embedded (two masters)",
        lambda: (f"{p['cpu_per_node_s']*1000:.3f} vs {s['embedded x2']['cpu_per_node_s']*1000:.3f} ms "
                 f"({s['cpu_ratio_x2']:.2f}×; {s['nodes']:,} nodes, database {p['db_cpu_per_node_s']*1000:.3f} ms more)",
                 s["cpu_ratio_x2"] <= CPU_TARGET))

    add("state store: master CPU per node run, two replicas on PostgreSQL / one master embedded (no target; "
        "the load in one process)",
        lambda: (f"{p['cpu_per_node_s']*1000:.3f} vs {s['embedded']['cpu_per_node_s']*1000:.3f} ms "
                 f"({s['cpu_ratio']:.2f}×)", None))

    def growth():
        g = [max(e["VmRSS"], e["VmHWM"]) - b["VmRSS"] for b, e in zip(p["rss_start"], p["rss_after"])]
        return (f"{' / '.join(f'+{x} MiB' for x in g)} ({p['inventory_nodes']:,} nodes, peak included)",
                max(g) <= RSS_TARGET_MIB)
    add(f"state store: each replica's RSS growth for the inventory's nodes ≤ {RSS_TARGET_MIB} MiB", growth)
    add(f"state store: `pluginsync-master inventory` over the inventory's nodes ≤ {INVENTORY_TARGET_S:.0f} s",
        lambda: (f"table {p['inventory_table']['median_s']:.2f} s, json {p['inventory_json']['median_s']:.2f} s "
                 f"({p['inventory_nodes']:,} nodes)", p["inventory_table"]["median_s"] <= INVENTORY_TARGET_S))
    add("state store: the database's size per node (no target)",
        lambda: (f"PostgreSQL {p['db_bytes_per_node']:,.0f} B; embedded SQLite {s['embedded']['bytes_per_node']:,.0f} B",
                 None))
