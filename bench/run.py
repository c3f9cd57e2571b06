#!/usr/bin/env python3
"""pluginsync bench: every figure of BENCHMARKS.md and its fleet-scale targets, in one run.

Generates the team's seeded Puppet environment (bench/vendor/gen_tree.py, or --shared DIR's copy;
default 60 modules, 3,000 plugin files, 25 MB, seed 1) and throwaway certificates, then runs the
selected scenarios (--scenarios, default all, in this order) and prints their tables and one
summary of every target with PASS/MISS; the figures also go to target/bench-results.json.

  speed  a release master and an rsync daemon (TCP_NODELAY on both ends: the daemon's `socket
         options`, the client's --sockopts) on a first-wins merged copy; each
         scenario --runs times for both tools into fresh destinations on the same filesystem:
         initial (empty destination; after one untimed warm-up of each tool), noop (nothing
         changed), 1% (30 plugin files changed by bench/vendor/mutate.py, the same files for both
         tools; the first change after the initial runs is timed on a row of its own); median,
         min-max, ratio.
         Puppet, when installed: a stock `puppet plugin download` against a throwaway Puppet
         Server 7 (scripts/puppetserver_sandbox.py, its own directory, CA and port; needs the
         `puppet` and `puppetserver` packages) with its request count and server CPU, and the same
         stock agent against the pluginsync master (--puppet-runs times; an initial takes ~30 s).
  load   the master's request rates (pluginsync-load: HTTPS with a client certificate, HTTP/1.1
         keep-alive like Puppet's agent) and its memory.
  busy   a busy node (bench/busy.py): a writer keeps ~--busy-mib MiB dirty on the libdir's
         filesystem; sync calls of a no-op run, and 1 % / no-op times quiet vs with the writer, for
         pluginsync and the rsync daemon.
  fleet  per agent run, each a new process (bench/fleet.py): master CPU, bytes on the wire both
         ways through a counting relay, nodes per 2-core master at a 30-minute interval; with
         dev-certs' ECDSA, Puppet-style RSA 4,096 and an RSA CA with a P-256 master key; Puppet
         Server's column (with speed, where installed).
  big    a 50,000-file environment (--big-files): master memory and the agent's no-op time.
  envs   --envs environments, each the default tree changed by 1 %, on one master (bench/envs.py):
         time to ready, RSS with all queried, re-index cost of one changed environment; the
         generation store's bytes vs one tree + the differences; then --envs-keep generations of each
         (a 1 % change between): RSS and the store again.
  cache  (not in the default run: --scenarios cache, or --fleet) --cache-nodes nodes sync a 1 % change
         from two masters directly, then through nginx with packaging/nginx-pluginsync-cache.conf
         (bench/cache.py; needs nginx): the bytes the masters send, with and without the cache.
  state  (not in the default run: --scenarios state; needs Debian's postgresql) --state-nodes simulated
         nodes (distinct certnames through the [proxy] listener) each do one node run against one master
         with the embedded store, two with their own, and two replicas sharing a throwaway PostgreSQL
         (bench/state.py): master CPU per node run, wall time, the database's CPU; then
         --state-inventory-nodes nodes in all: replicas' RSS growth, `pluginsync-master inventory`'s
         time, the database's size per node.
  trust  (not in the default run: --scenarios trust; needs `tuftool`, SKIPPED without) signing on vs off in
         one run (bench/trust.py): a master and a node without [trust], and the same with the keys of
         scripts/trust-quickstart.sh and every generation signed by scripts/sign-generation.sh; master CPU
         per no-op run, agent no-op, 1 % and initial wall times, alternated; the agent's verification time.

--quick makes every count small (a smoke run in a few minutes; its verdicts are indicative only).
The full run takes ~20 minutes on a 2-core machine, most of it Puppet's own runs.
Work files go to --work (default a new directory under /tmp, which must be a disk filesystem for
the busy node) and /dev/shm (the environments), removed at the end unless --keep.
"""
import argparse, importlib.util, json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import busy, cache, envs, fleet, state, trust  # noqa: E402
from common import (LISTING_QUERY, LOAD, MASTER, ROOT, agent_config, fmt_s, free_port, log, master_config,  # noqa: E402
                    one_node_many_connections, procs, rss, run, start_master, stats, stop, timed, wait_port)

SCENARIOS = ["speed", "load", "busy", "fleet", "big", "envs", "cache", "state", "trust"]
DEFAULT = [s for s in SCENARIOS if s not in ("cache", "state", "trust")]  # their figures are asked for by name
TARGETS = {  # scenario -> ratio to rsync (BENCHMARKS.md#targets-and-the-latest-figures)
    "initial": 1.0,
    "noop": 0.3,
    "1%": 0.5,
}
# Counts of a full run and of --quick; an option given on the command line wins over both.
FULL = {"runs": 7, "puppet_runs": 3, "load_seconds": 5, "fleet_runs": 60, "fleet_change_runs": 20,
        "busy_runs": 5, "busy_mib": 1024, "envs": 100, "big_files": 50000, "cache_nodes": 100,
        "state_nodes": 10000, "state_inventory_nodes": 100000, "trust_runs": 200, "trust_change_runs": 20}
QUICK = {"runs": 2, "puppet_runs": 1, "load_seconds": 1, "fleet_runs": 8, "fleet_change_runs": 3,
         "busy_runs": 2, "busy_mib": 1024, "envs": 10, "big_files": 5000, "cache_nodes": 10,
         "state_nodes": 1000, "state_inventory_nodes": 10000, "trust_runs": 10, "trust_change_runs": 3}


def load_sandbox():
    """scripts/puppetserver_sandbox.py, the one way the tests and the bench start Puppet Server."""
    spec = importlib.util.spec_from_file_location("puppetserver_sandbox",
                                                  os.path.join(ROOT, "scripts", "puppetserver_sandbox.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def merged_copy(env_dir, out):
    """First-wins merge of every module's lib/ and facts.d/ (modules by name), mtimes kept."""
    mods = sorted(os.listdir(os.path.join(env_dir, "modules")))
    for sub in ("lib", "facts.d"):
        dest = os.path.join(out, sub)
        os.makedirs(dest, exist_ok=True)
        for m in mods:
            src = os.path.join(env_dir, "modules", m, sub)
            if not os.path.isdir(src):
                continue
            for dp, dn, fn in os.walk(src):
                rel = os.path.relpath(dp, src)
                os.makedirs(os.path.join(dest, rel), exist_ok=True)
                for f in fn:
                    d = os.path.join(dest, rel, f)
                    if not os.path.exists(d):
                        shutil.copy2(os.path.join(dp, f), d)


def move_aside(dest, work):
    """Empties the way for an initial run by renaming `dest` into a graveyard
    that is deleted only when the bench ends.

    Deleting thousands of files just before creating thousands more is not
    what a node's first sync looks like, and on a journal-less ext4 (this
    machine kind's root) it is a trap: the inode allocator skips inodes freed
    in the last 60-360 s (ext4 `recently_deleted()`, checked only without a
    journal), re-scanning them for every new file, so each run would pay for
    the previous run's deletions, unevenly between tools."""
    if os.path.lexists(dest):
        graveyard = os.path.join(work, "graveyard")
        os.makedirs(graveyard, exist_ok=True)
        os.rename(dest, os.path.join(graveyard, str(len(os.listdir(graveyard)))))


class Ctx:
    """What the scenarios share: the options, the work directory, the tree and its copies, the
    certificates, and `mutate()`, which changes 1 % of every copy of the tree the same way."""

    def __init__(self, a, work, gen, mutate_py):
        self.a, self.work, self.gen, self.mutate_py = a, work, gen, mutate_py
        self.envs = os.path.join(work, "envs")
        self.env = os.path.join(self.envs, "production")
        self.merged = os.path.join(work, "rsync", "plugins")
        self.ssl = os.path.join(work, "ssl")
        self.ps_env = None  # Puppet Server's copy while it runs
        self.rev = 0
        self.cleanup = []

    def mutate(self):
        """A new revision of the same 30 files in every copy; returns {changed, content_bytes}: the
        number of files and their new size in bytes (what a node must download at least)."""
        self.rev += 1
        roots = [(self.env, "env"), (os.path.join(self.merged, "lib"), "merged")]
        if self.ps_env:
            roots.append((self.ps_env, "env"))
        first = None
        for root, layout in roots:
            r = run([sys.executable, self.mutate_py, root, "--layout", layout, "--percent", "1", "--rev",
                     str(self.rev), "--list"], stdout=subprocess.PIPE, text=True)
            if first is None:
                first = r.stdout.splitlines()
        summary = json.loads(first[0])
        lib = os.path.join(self.merged, "lib")
        content = sum(os.path.getsize(os.path.join(lib, rel)) for rel in first[1:] if rel)
        return {"changed": summary["changed"], "content_bytes": content}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(DEFAULT),
                    help=f"comma-separated, from {','.join(SCENARIOS)} (default: all)")
    ap.add_argument("--skip", default="", help="comma-separated scenarios to leave out")
    ap.add_argument("--fleet", action="store_true", help="the fleet-scale scenarios only: fleet,busy,envs,cache")
    ap.add_argument("--quick", action="store_true", help="small counts everywhere: a smoke run")
    ap.add_argument("--runs", type=int, help=f"runs of each speed scenario (default {FULL['runs']})")
    ap.add_argument("--puppet-runs", type=int,
                    help=f"runs of the Puppet columns and of Puppet Server's fleet column (default {FULL['puppet_runs']})")
    ap.add_argument("--load-seconds", type=int, help=f"seconds of each load figure (default {FULL['load_seconds']})")
    ap.add_argument("--fleet-runs", type=int, help=f"no-op agent runs per certificate kind (default {FULL['fleet_runs']})")
    ap.add_argument("--fleet-change-runs", type=int,
                    help=f"1 %% agent runs per certificate kind (default {FULL['fleet_change_runs']})")
    ap.add_argument("--busy-runs", type=int, help=f"runs of each busy-node figure (default {FULL['busy_runs']})")
    ap.add_argument("--busy-mib", type=int, help=f"dirty data the busy node's writer keeps (default {FULL['busy_mib']})")
    ap.add_argument("--envs", type=int, help=f"environments of the envs scenario (default {FULL['envs']})")
    ap.add_argument("--envs-keep", type=int, default=5,
                    help="generations of each environment of the envs scenario, its [generations] keep (default 5; "
                         "1: one generation each)")
    ap.add_argument("--big-files", type=int, help=f"files of the big environment (default {FULL['big_files']})")
    ap.add_argument("--cache-nodes", type=int, help=f"nodes of the cache scenario (default {FULL['cache_nodes']})")
    ap.add_argument("--state-nodes", type=int,
                    help=f"simulated nodes of the state scenario's timed run (default {FULL['state_nodes']})")
    ap.add_argument("--state-inventory-nodes", type=int,
                    help=f"nodes in the inventory for its RSS, inventory and size figures (default {FULL['state_inventory_nodes']})")
    ap.add_argument("--state-concurrency", type=int, default=32, help="client threads of the state scenario (default 32)")
    ap.add_argument("--trust-runs", type=int,
                    help=f"no-op agent runs of each trust setup, signing off and on (default {FULL['trust_runs']})")
    ap.add_argument("--trust-change-runs", type=int,
                    help=f"1 %% change runs of each trust setup (default {FULL['trust_change_runs']})")
    ap.add_argument("--big", action="store_true", help="kept for old command lines: big is in the default run")
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--modules", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-puppet-server", action="store_true", help="skip the Puppet Server columns")
    ap.add_argument("--shared", default=None,
                    help="a directory holding bench/gen_tree.py and bench/mutate.py (default: bench/vendor's copies)")
    ap.add_argument("--work", default=None, help="work directory (default: a new one under /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--no-build", action="store_true", help="use target/release as it is")
    ap.add_argument("--results", default=os.path.join(ROOT, "target", "bench-results.json"))
    a = ap.parse_args()
    for k, v in (QUICK if a.quick else FULL).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    chosen = "fleet,busy,envs,cache" if a.fleet else a.scenarios
    sel = [s.strip() for s in chosen.split(",") if s.strip()]
    skip = [s.strip() for s in a.skip.split(",") if s.strip()]
    for s in sel + skip:
        if s not in SCENARIOS:
            raise SystemExit(f"error: unknown scenario '{s}' (known: {', '.join(SCENARIOS)})")
    a.selected = [s for s in SCENARIOS if s in sel and s not in skip]

    gen_dir = os.path.join(a.shared, "bench") if a.shared else os.path.join(ROOT, "bench", "vendor")
    gen = os.path.join(gen_dir, "gen_tree.py")
    mutate_py = os.path.join(gen_dir, "mutate.py")
    if not os.path.isfile(gen):
        raise SystemExit(f"error: {gen} not found (--shared DIR must hold bench/gen_tree.py)")
    if {"speed", "busy"} & set(a.selected) and not shutil.which("rsync"):
        raise SystemExit("error: rsync is not installed (apt-get install rsync)")
    if "busy" in a.selected and not shutil.which("strace"):
        raise SystemExit("error: strace is not installed (apt-get install strace), the busy node counts sync calls")
    if "fleet" in a.selected and not shutil.which("openssl"):
        raise SystemExit("error: openssl is not installed, the fleet figures make RSA certificates with it")
    if not a.no_build:
        log("building release binaries")
        run(["cargo", "build", "--release", "--quiet", "--workspace", "--bins"], cwd=ROOT)
    work = a.work or tempfile.mkdtemp(prefix="pluginsync-bench-", dir="/tmp")
    os.makedirs(work, exist_ok=True)
    ctx = Ctx(a, work, gen, mutate_py)
    params = {k: v for k, v in vars(a).items()}
    results = {"machine": machine(), "params": params, "commit": commit(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t0 = time.monotonic()
    def on_term(*_):
        raise KeyboardInterrupt  # not SystemExit: a scenario's failure is caught, a stop is not

    signal.signal(signal.SIGTERM, on_term)
    try:
        bench(ctx, results)
    finally:
        for p in procs:
            stop(p)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
            for d in ctx.cleanup:
                shutil.rmtree(d, ignore_errors=True)
        else:
            log(f"kept {work} {' '.join(ctx.cleanup)}")
    results["seconds"] = time.monotonic() - t0
    results["targets"] = [{"target": n, "measured": v, "verdict": x} for n, v, x in targets(results)]
    os.makedirs(os.path.dirname(os.path.abspath(a.results)), exist_ok=True)
    with open(a.results, "w") as f:
        json.dump(results, f, indent=1)
    print_tables(results)
    print_summary(results)
    log(f"results: {a.results}; {results['seconds']/60:.1f} min")


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 30)
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": mem, "kernel": os.uname().release}


def commit():
    r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or "?"


def bench(ctx, results):
    a = ctx.a
    sel = a.selected
    log(f"scenarios: {', '.join(sel)}; generating the environment in {ctx.env}")
    run([sys.executable, ctx.gen, "--out", ctx.env, "--files", str(a.files), "--modules", str(a.modules),
         "--seed", str(a.seed)], stdout=subprocess.DEVNULL)
    merged_copy(ctx.env, ctx.merged)
    run([MASTER, "dev-certs", "--out", ctx.ssl, "--agent", "bench-node"], stdout=subprocess.DEVNULL)

    w = {}  # what speed, load and busy share: the watching master, the rsync daemon, the nodes
    if {"speed", "load", "busy"} & set(sel):
        mconf = os.path.join(ctx.work, "master.toml")
        master_config(mconf, ctx.envs, ctx.ssl, http=one_node_many_connections(ctx.envs, ctx.ssl, ctx.work))
        w["master"], port = start_master(mconf)
        w["url"] = f"https://localhost:{port}"
        log(f"master on {w['url']}")
        rport = free_port()
        rconf = os.path.join(ctx.work, "rsyncd.conf")
        with open(rconf, "w") as f:
            f.write(f"use chroot = no\nsocket options = TCP_NODELAY\npid file = {ctx.work}/rsyncd.pid\n"
                    f"[plugins]\npath = {ctx.merged}\nread only = yes\n")
        rsyncd = subprocess.Popen(["rsync", "--daemon", "--no-detach", f"--config={rconf}", f"--port={rport}",
                                   "--address=127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(rsyncd)
        wait_port(rport)
        w["node"] = os.path.join(ctx.work, "node")
        w["agent"] = agent_config(os.path.join(ctx.work, "agent.toml"), w["url"], w["node"], ctx.ssl)
        w["rnode"] = os.path.join(ctx.work, "rnode")
        # TCP_NODELAY on the client too, as on the daemon (`socket options`):
        # without it Nagle against delayed ACKs adds 40-100 ms to every
        # small exchange, and the baseline would be a handicapped rsync.
        w["rsync"] = ["rsync", "-a", "--delete", "--sockopts=TCP_NODELAY",
                      f"rsync://127.0.0.1:{rport}/plugins/", w["rnode"] + "/"]
        w["rsyncd"] = rsyncd
    def guarded(name, fn, *args):
        """One scenario; its failure is recorded and the run goes on with the next one."""
        if name not in sel:
            return
        try:
            fn(*args)
        except (Exception, SystemExit) as e:  # noqa: BLE001 -- any failure, reported with the scenario's name
            msg = str(e) or type(e).__name__
            log(f"error: scenario {name} failed: {msg}")
            results.setdefault("errors", {})[name] = msg

    guarded("speed", speed, ctx, results, w)
    guarded("load", load, ctx, results, w)
    guarded("busy", busy.run, ctx, results, timed, w.get("agent"), w.get("rsync"), w.get("node"), w.get("rnode"))
    if w:
        results.setdefault("memory", {})["master, bench environment, at the end of speed/load/busy"] = rss(w["master"].pid)
        stop(w["master"])
        stop(w["rsyncd"])
    guarded("fleet", fleet.run, ctx, results)
    guarded("big", big, ctx, results)
    guarded("envs", envs.run, ctx, results)
    guarded("cache", cache.run, ctx, results)
    guarded("state", state.run, ctx, results)
    guarded("trust", trust.run, ctx, results, move_aside)


def speed(ctx, results, w):
    a, work = ctx.a, ctx.work
    results["scenarios"] = {}
    agent, node, rsync, rnode, port = w["agent"], w["node"], w["rsync"], w["rnode"], int(w["url"].rsplit(":", 1)[1])
    puppet = shutil.which("puppet")

    def puppet_cmd(pnode, pport, pssl):
        return [puppet, "plugin", "download", "--color", "false", "--certname", "bench-node", "--server", "localhost",
                "--serverport", str(pport), "--environment", "production", "--ssldir", pssl,
                "--confdir", f"{pnode}/conf", "--vardir", f"{pnode}/var", "--codedir", f"{pnode}/code",
                "--logdir", f"{pnode}/log", "--rundir", f"{pnode}/run", "--publicdir", f"{pnode}/public",
                "--libdir", f"{pnode}/var/lib", "--pluginfactdest", f"{pnode}/var/facts.d"]

    # tool -> (command, what an initial run empties, runs, is Puppet)
    tools = {"pluginsync": (agent, node, a.runs, False), "rsync": (rsync, rnode, a.runs, False)}
    # rsync with the durability pluginsync gives (every file on disk before
    # it is visible), for scale: rsync >= 3.2.4 fsyncs each file.
    if "--fsync" in subprocess.run(["rsync", "--help"], capture_output=True, text=True).stdout:
        rfnode = os.path.join(work, "rfnode")
        tools["rsync --fsync"] = (rsync[:-1] + ["--fsync", rfnode + "/"], rfnode, a.runs, False)
    ps = None
    results["puppet_server"] = {}
    if not puppet:
        results["puppet_server"]["note"] = "not measured: puppet is not installed (apt-get install puppet puppetserver)"
    elif a.no_puppet_server:
        results["puppet_server"]["note"] = "not measured: --no-puppet-server"
    else:
        sandbox = load_sandbox()
        if not sandbox.installed():
            results["puppet_server"]["note"] = "not measured: puppetserver is not installed (apt-get install puppetserver)"
        else:
            psdir = os.path.join(work, "puppetserver")
            psport = free_port()
            sandbox.setup(psdir, psport)
            ctx.ps_env = os.path.join(psdir, "code", "environments", "production")
            shutil.copytree(ctx.env, ctx.ps_env, symlinks=True)
            log(f"starting Puppet Server on 127.0.0.1:{psport} (a JVM: ~20-60 s)")
            ps = sandbox.start(psdir, psport)
            procs.append(ps)
            sandbox.generate(psdir, "bench-node")
            pnode_ps = os.path.join(work, "pnode-ps")
            pssl = os.path.join(psdir, "ssl")
            tools["puppet agent -> Puppet Server"] = (puppet_cmd(pnode_ps, psport, pssl), pnode_ps, a.puppet_runs, True)
            access_log = os.path.join(psdir, "log", "access.log")
    if puppet:
        pnode = os.path.join(work, "pnode")
        tools["puppet agent -> pluginsync master"] = (puppet_cmd(pnode, port, ctx.ssl), pnode, a.puppet_runs, True)

    def requests_so_far():
        with open(access_log) as f:
            return sum(1 for _ in f)

    ps_cost = {}  # scenario -> {"requests": [...], "cpu_s": [...]}

    def timed_tool(scenario, t):
        cmd = tools[t][0]
        # Untimed: write back what the previous tool left dirty, so no run
        # pays for another's writeback (pluginsync's syncfs would).
        os.sync()
        if t != "puppet agent -> Puppet Server":
            return timed(cmd)
        from common import cpu_seconds
        r0, c0 = requests_so_far(), cpu_seconds(ps.pid)
        dt = timed(cmd)
        cost = ps_cost.setdefault(scenario, {"requests": [], "cpu_s": []})
        cost["requests"].append(requests_so_far() - r0)
        cost["cpu_s"].append(cpu_seconds(ps.pid) - c0)
        return dt

    sc = results["scenarios"]
    for name in ("initial", "noop", "1%"):
        sc[name] = {t: [] for t in tools}
    # One untimed initial of each tool first, as hyperfine's --warmup: the
    # first request to a freshly started master or rsync daemon (page
    # cache, lazily built state) says nothing about a sync. Puppet's
    # columns (no target, ~20 s a run) get none.
    log("initial, warm-up")
    for t, (cmd, dest, _, is_puppet) in tools.items():
        if not is_puppet:
            move_aside(dest, work)
            timed_tool("warm-up", t)
    for i in range(a.runs):
        log(f"initial, run {i+1}/{a.runs}")
        for t, (cmd, dest, runs, is_puppet) in tools.items():
            if i >= runs:
                continue
            move_aside(dest, work)
            if is_puppet:
                os.makedirs(f"{dest}/var")  # Puppet creates its libdir only inside an existing vardir
            sc["initial"][t].append(timed_tool("initial", t))
    for i in range(a.runs):
        log(f"noop, run {i+1}/{a.runs}")
        for t, (_, _, runs, _) in tools.items():
            if i < runs:
                sc["noop"][t].append(timed_tool("noop", t))
    # The first change after a first sync is a node's once in its life:
    # pluginsync fills the standby its first sync left empty (a copy of
    # the whole tree, docs/internals.md#the-switch). Timed for every tool
    # but reported on its own row, so the 1 % row is what every later
    # change costs.
    log("1% change, the first after a first sync")
    ctx.mutate()
    time.sleep(1.0)
    results["first_change"] = {t: timed_tool("first change", t) for t, (_, _, _, p) in tools.items() if not p}
    for i in range(a.runs):
        log(f"1% change, run {i+1}/{a.runs}")
        ctx.mutate()
        time.sleep(1.0)  # the master re-indexes (200 ms debounce); not timed
        for t, (_, _, runs, _) in tools.items():
            if i < runs:
                sc["1%"][t].append(timed_tool("1%", t))
    for name in sc:
        for t in sc[name]:
            sc[name][t] = stats(sc[name][t])
    for name, cost in ps_cost.items():
        results["puppet_server"][name] = {"requests": statistics.median(cost["requests"]),
                                          "cpu_s": statistics.median(cost["cpu_s"])}
    if ps is not None:
        if "fleet" in a.selected:
            try:
                fleet.puppet_server_column(results, ps, lambda p: puppet_cmd(pnode_ps, p, pssl), psport, a.puppet_runs)
            except (Exception, SystemExit) as e:  # noqa: BLE001 -- the speed figures stay
                log(f"error: Puppet Server's fleet column failed: {e}")
                results.setdefault("errors", {})["fleet (Puppet Server column)"] = str(e)
        results.setdefault("memory", {})["Puppet Server (JVM), after the Puppet runs"] = rss(ps.pid)
        stop(ps, 30)
        ctx.ps_env = None


def load(ctx, results, w):
    """Master load, with the bench node's certificate."""
    a, ssl, url, merged = ctx.a, ctx.ssl, w["url"], ctx.merged
    results["load"] = {}
    cmd = [LOAD, "--ca", f"{ssl}/certs/ca.pem", "--cert", f"{ssl}/certs/bench-node.pem",
           "--key", f"{ssl}/private_keys/bench-node.pem", "--duration", f"{a.load_seconds}s"]
    listing = f"{url}/puppet/v3/file_metadatas/plugins?{LISTING_QUERY}&environment=production"
    small = min(((abs(os.path.getsize(os.path.join(dp, f)) - 4300), os.path.relpath(os.path.join(dp, f), merged + "/lib"))
                 for dp, _, fn in os.walk(merged + "/lib") for f in fn))[1]
    content = f"{url}/puppet/v3/file_content/plugins/{small}?environment=production"
    for key, extra in [("listing, 1 connection", ["--url", listing, "--connections", "1"]),
                       ("listing, 64 connections", ["--url", listing, "--connections", "64"]),
                       ("listing 304, 64 connections", ["--url", listing, "--connections", "64", "--if-none-match", "auto"]),
                       (f"small file content ({os.path.getsize(os.path.join(merged, 'lib', small))} B), 1 connection",
                        ["--url", content, "--connections", "1"]),
                       ("small file content, 8 connections", ["--url", content, "--connections", "8"])]:
        log(f"load: {key}")
        r = subprocess.run(cmd + extra, capture_output=True, text=True, check=True)
        results["load"][key] = json.loads(r.stdout)
    results.setdefault("memory", {})["master, bench environment, after load"] = rss(w["master"].pid)


def big(ctx, results):
    a, work = ctx.a, ctx.work
    big_envs = os.path.join(work, "bigenvs")
    log(f"generating the {a.big_files:,}-file environment")
    run([sys.executable, ctx.gen, "--out", os.path.join(big_envs, "production"), "--files", str(a.big_files),
         "--modules", str(min(300, a.big_files // 3)), "--seed", str(a.seed), "--target-mb", str(max(1, a.big_files * 200 // 50000))],
        stdout=subprocess.DEVNULL)
    bconf = os.path.join(work, "big-master.toml")
    master_config(bconf, big_envs, ctx.ssl)
    bigm, port = start_master(bconf, timeout=600)
    mem = results.setdefault("memory", {})
    mem[f"master, {a.big_files:,}-file environment, idle"] = rss(bigm.pid)
    bnode = os.path.join(work, "bignode")
    bagent = agent_config(os.path.join(work, "big-agent.toml"), f"https://localhost:{port}", bnode, ctx.ssl)
    os.sync()  # the generated tree is not the agent's to write back
    results["big_files"] = a.big_files
    results["big_initial"] = stats([timed(bagent)])
    results["big_noop"] = stats([timed(bagent) for _ in range(a.runs)])
    mem[f"master, {a.big_files:,}-file environment, after a sync"] = rss(bigm.pid)
    stop(bigm)
    shutil.rmtree(big_envs, ignore_errors=True)
    shutil.rmtree(bnode, ignore_errors=True)


def print_tables(r):
    m = r["machine"]
    p = r["params"]
    print(f"\nmachine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, Linux {m['kernel']}; commit {r['commit']}; "
          f"{p['files']} plugin files in {p['modules']} modules, seed {p['seed']}; scenarios {', '.join(p['selected'])}"
          + ("; QUICK run" if p["quick"] else ""))
    sc = r.get("scenarios")
    if sc:
        tools = list(next(iter(sc.values())).keys())
        print(f"\n{p['runs']} runs each ({p['puppet_runs']} for Puppet)\n")
        ps_col = "puppet agent -> Puppet Server"
        extra = ["pluginsync / Puppet Server"] if ps_col in tools else []
        print("| scenario | " + " | ".join(f"{t} median (min–max)" for t in tools) + " | pluginsync / rsync | "
              + "".join(f"{e} | " for e in extra) + "target |")
        print("|" + "---|" * (len(tools) + 3 + len(extra)))
        for name, per in sc.items():
            cells = [f"{fmt_s(per[t]['median'])} ({fmt_s(per[t]['min'])}–{fmt_s(per[t]['max'])})" for t in tools]
            ratio = per["pluginsync"]["median"] / per["rsync"]["median"]
            tr = TARGETS[name]
            ps_ratio = "".join(f"{per['pluginsync']['median'] / per[ps_col]['median']:.3f}× | " for _ in extra)
            print(f"| {name} | " + " | ".join(cells) + f" | {ratio:.2f}× | {ps_ratio}≤ {tr}× rsync |")
        first = r.get("first_change")
        if first:
            print("\nthe first 1 % change after a first sync, once (not in the 1 % row; pluginsync fills the standby "
                  "its first sync left empty): " + ", ".join(f"{t} {fmt_s(v)}" for t, v in first.items()))
        ps = r["puppet_server"]
        if "note" in ps:
            print(f"\nPuppet Server: {ps['note']}")
        else:
            print("\nPuppet Server's cost per `puppet plugin download` (median): "
                  + "; ".join(f"{k}: {v['requests']:.0f} requests, {v['cpu_s']:.1f} s server CPU" for k, v in ps.items()))
    if r.get("load"):
        print("\n| master load (HTTPS, client certificate, HTTP/1.1 keep-alive) | req/s | p50 | p99 | errors |")
        print("|---|---|---|---|---|")
        for k, v in r["load"].items():
            print(f"| {k} | {v['rps']:.0f} | {v['p50_ms']:.2f} ms | {v['p99_ms']:.2f} ms | {v['errors']} |")
    if r.get("memory"):
        print("\n| memory | RSS | peak RSS |")
        print("|---|---|---|")
        for k, v in r["memory"].items():
            print(f"| {k} | {v.get('VmRSS')} MiB | {v.get('VmHWM')} MiB |")
    if "big_noop" in r:
        print(f"\nagent on the {r['big_files']:,}-file tree: initial {fmt_s(r['big_initial']['median'])}, "
              f"no-op median {fmt_s(r['big_noop']['median'])} ({fmt_s(r['big_noop']['min'])}–{fmt_s(r['big_noop']['max'])})")
    busy.print_table(r)
    fleet.print_table(r)
    envs.print_table(r)
    cache.print_table(r)
    state.print_table(r)
    trust.print_table(r)


def targets(r):
    """[(target, measured, verdict)] for every target of BENCHMARKS.md."""
    out = []

    def add(name, fn):
        try:
            value, ok = fn()
            verdict = ok if isinstance(ok, str) else "info" if ok is None else "PASS" if ok else "MISS"
            out.append((name, value, verdict))
        except (KeyError, TypeError, ValueError, ZeroDivisionError, StopIteration):
            out.append((name, "not measured", "–"))

    fl = r.get("fleet", {})
    for kind, limit, label in (("rsa", 0.002, "Puppet-style RSA 4,096"), ("ecdsa", 0.001, "ECDSA (dev-certs)")):
        add(f"master CPU per no-op run, {label} ≤ {limit*1000:.0f} ms"
            + (" (≥ 1.8 M nodes per 2-core master at 30 min)" if kind == "rsa" else ""),
            lambda kind=kind, limit=limit: (
                f"{fl[kind]['noop']['master_cpu_s']*1000:.2f} ms ({fl[kind]['noop']['nodes_per_2core_master']/1e6:.2f} M nodes)",
                fl[kind]["noop"]["master_cpu_s"] <= limit))
    add("RSA CA with a P-256 master key: master CPU per no-op run (no target; the cheap option)",
        lambda: (f"{fl['rsa-p256']['noop']['master_cpu_s']*1000:.2f} ms "
                 f"({fl['rsa-p256']['noop']['nodes_per_2core_master']/1e6:.2f} M nodes)", None))

    def rollout_noise():
        plain, placed = fl["ecdsa"], fl["ecdsa-rollout"]
        cpu = placed["noop"]["master_cpu_s"] / plain["noop"]["master_cpu_s"]
        rate = placed["rate_304"] / plain["rate_304"]
        return (f"CPU per no-op {placed['noop']['master_cpu_s']*1000:.2f} vs {plain['noop']['master_cpu_s']*1000:.2f} ms "
                f"({cpu:.2f}×); 304 rate {placed['rate_304']:,.0f} vs {plain['rate_304']:,.0f} req/s ({rate:.2f}×)",
                cpu <= 1.25 and rate >= 0.8)
    if "ecdsa-rollout" in fl:
        add("a rollout active: master CPU per no-op run ≤ 1.25× and the 304 rate ≥ 0.8× without one (ECDSA)",
            rollout_noise)

    def wire():
        kinds = [k for k, _ in fleet.KINDS if k in fl and "1%" in fl[k]]
        worst = max(fl[k]["1%"]["overhead_bytes"] for k in kinds)
        shown = ", ".join(f"{k} {fl[k]['1%']['overhead_bytes']/1000:,.1f} KB" for k in kinds)
        content = fl[kinds[0]]["1%"]["changed_content_bytes"]
        return f"{shown} over {content/1000:,.1f} KB of content", worst <= 20_000 and bool(kinds)
    add("bytes on the wire per node for a 1 % change ≤ 20 KB + the changed files' content", wire)
    e = r.get("envs", {})
    add(f"{e.get('count', 100)} environments: health check ready ≤ 10 s after start",
        lambda: (f"{e['ready_s']:.2f} s", e["ready_s"] <= 10))
    add(f"{e.get('count', 100)} environments: RSS ≤ 256 MiB with all queried once",
        lambda: (f"{e['rss_after_all']['VmRSS']} MiB", e["rss_after_all"]["VmRSS"] <= 256))
    add(f"{e.get('count', 100)} environments × keep {e.get('keep', a_keep(r))} generations: master RSS ≤ 256 MiB "
        "(every answer, manifest and listing asked once)",
        lambda: (f"{e['rss_keep']['VmRSS']} MiB (peak {e['rss_keep']['VmHWM']} MiB)",
                 max(e["rss_keep"]["VmRSS"], e["rss_keep"]["VmHWM"]) <= 256))

    def store(when):
        st = e[f"store_{when}"]
        ratio = envs.store_ratio(e, when)
        return (f"{st['blobs']/1e6:,.1f} MB vs one tree {e['tree_bytes']/1e6:,.1f} MB + differences "
                f"{e[f'diff_bytes_{when}']/1e6:,.1f} MB ({ratio:.2f}×)", ratio <= 1.1)
    add(f"{e.get('count', 100)} environments, each 1 % apart: generation store ≤ 1.1× one tree + the differences",
        lambda: store("ready"))
    add(f"{e.get('count', 100)} environments × keep {e.get('keep', a_keep(r))}: generation store ≤ 1.1× one tree "
        "+ the differences", lambda: store("keep"))
    add("re-index of one environment after a 1 % change ≤ 0.1× its full index",
        lambda: (f"{e['reindex_1pct_cpu_s']*1000:.0f} ms vs {e['full_index_one_env_cpu_s']*1000:.0f} ms "
                 f"({e['reindex_ratio']:.2f}×)", e["reindex_ratio"] <= 0.1))
    b = r.get("busy", {})
    add("busy node: a no-op run makes no sync call",
        lambda: (", ".join(f"{k} {v}" for k, v in b["noop_sync_calls"].items()) or "none",
                 sum(b["noop_sync_calls"].values()) == 0))
    add("busy node: 1 % with the writer ≤ 2× quiet",
        lambda: (f"{fmt_s(b['busy']['pluginsync 1%']['median'])} vs {fmt_s(b['quiet']['pluginsync 1%']['median'])} "
                 f"({b['ratio_busy_to_quiet_1%']:.2f}×)", b["ratio_busy_to_quiet_1%"] <= 2))
    add("busy node: 1 % with the writer ≤ 0.5× the rsync daemon with the writer",
        lambda: (f"{fmt_s(b['busy']['pluginsync 1%']['median'])} vs {fmt_s(b['busy']['rsync 1%']['median'])} "
                 f"({b['ratio_to_rsync_busy_1%']:.2f}×)", b["ratio_to_rsync_busy_1%"] <= 0.5))
    sc = r.get("scenarios", {})
    for name, label in (("initial", "initial sync"), ("noop", "no-op sync"), ("1%", "1 % sync")):
        add(f"{label} ≤ {TARGETS[name]}× the rsync daemon",
            lambda name=name: (f"{fmt_s(sc[name]['pluginsync']['median'])} vs {fmt_s(sc[name]['rsync']['median'])} "
                               f"({sc[name]['pluginsync']['median'] / sc[name]['rsync']['median']:.2f}×)",
                               sc[name]["pluginsync"]["median"] / sc[name]["rsync"]["median"] <= TARGETS[name]))
    ld = r.get("load", {})
    for key, limit in (("listing 304, 64 connections", 20_000), ("small file content, 8 connections", 10_000),
                       ("listing, 1 connection", 600)):
        add(f"{key} ≥ {limit:,} req/s", lambda key=key, limit=limit: (f"{ld[key]['rps']:,.0f} req/s", ld[key]["rps"] >= limit))
    ch = r.get("cache", {})

    def cached():
        w, wo = ch["with"], ch["without"]
        return (f"{w['content_bytes']/1000:,.1f} KB of content for {w['nodes']} nodes "
                f"({w['changed_content_bytes']/1000:,.1f} KB changed; without the cache "
                f"{wo['content_bytes']/1000:,.1f} KB); all bytes {w['master_bytes']/1000:,.1f} KB vs "
                f"{wo['master_bytes']/1000:,.1f} KB", w["content_bytes"] <= 2 * w["changed_content_bytes"])
    if "with" in ch:  # an opt-in scenario: no row when it did not run
        add("behind nginx's cache, a 1 % change costs the masters ≤ 2× the changed files' content", cached)
    mem = r.get("memory", {})

    def bigmem():
        n = r["big_files"]
        idle = mem[f"master, {n:,}-file environment, idle"]["VmRSS"]
        after = mem[f"master, {n:,}-file environment, after a sync"]["VmRSS"]
        return f"idle {idle} MiB, after a sync {after} MiB", max(idle, after) <= 64
    add("50,000-file environment: master RSS ≤ 64 MiB (idle and after a sync)", bigmem)
    add("50,000-file environment: agent no-op ≤ 300 ms",
        lambda: (fmt_s(r["big_noop"]["median"]), r["big_noop"]["median"] <= 0.3))
    if "state" in r:  # an opt-in scenario: no rows when it did not run
        state.targets(r, add)
    if "trust" in r:
        trust.targets(r, add)
    return out


def a_keep(r):
    """The --envs-keep of a run, for a row's name when the envs scenario did not run."""
    return r.get("params", {}).get("envs_keep", 5)


def print_summary(r):
    rows = [(t["target"], t["measured"], t["verdict"]) for t in r["targets"]]
    q = " (QUICK run: small counts, verdicts indicative only)" if r["params"]["quick"] else ""
    if r["params"]["big_files"] != 50000:
        q += f" (big environment: {r['params']['big_files']:,} files, not 50,000)"
    if r["params"]["envs"] != 100:
        q += f" ({r['params']['envs']} environments, not 100)"
    print(f"\n## Targets{q}\n")
    print("| target | measured | verdict |")
    print("|---|---|---|")
    for name, value, verdict in rows:
        print(f"| {name} | {value} | {verdict} |")
    for name, msg in r.get("errors", {}).items():
        print(f"\nscenario {name} FAILED: {msg}")


if __name__ == "__main__":
    main()
