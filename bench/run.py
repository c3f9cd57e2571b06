#!/usr/bin/env python3
"""pluginsync bench: pluginsync against an rsync daemon (and Puppet where installed), in one run.

Generates the team's seeded Puppet environment (bench/vendor/gen_tree.py, or --shared DIR's copy; default 60 modules,
3,000 plugin files, 25 MB, seed 1), starts a release pluginsync master on it with throwaway
certificates and an rsync daemon (TCP_NODELAY) on a first-wins merged copy, then times each
scenario --runs times for both tools into fresh destinations on the same filesystem:

  initial   empty destination
  noop      nothing changed
  1%        30 plugin files changed by bench/vendor/mutate.py (the same files for both tools)

and prints one table: median, min-max, and the ratio pluginsync / rsync, against the targets.
Then the master's load figures (pluginsync-load: HTTPS with a client certificate, HTTP/1.1
keep-alive like Puppet's agent) and its memory. --big adds a 50,000-file environment: master
memory with it loaded and the agent's no-op time on it.

Puppet, when installed: a stock `puppet plugin download` against a throwaway Puppet Server 7
(scripts/puppetserver_sandbox.py, its own CA and a copy of the same environment; needs the
`puppet` and `puppetserver` packages) -- the Puppet column of the speed issue, with its request
count and server CPU -- and the same stock agent against the pluginsync master. --puppet-runs sets
how many times the Puppet columns run (an initial Puppet sync takes ~30 s).

usage: python3 bench/run.py [--runs 5] [--puppet-runs 3] [--files 3000] [--modules 60] [--seed 1]
                            [--big] [--no-puppet-server] [--shared DIR] [--work DIR] [--keep] [--no-build]
"""
import argparse, importlib.util, json, os, re, shutil, signal, socket, statistics, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL = os.path.join(ROOT, "target", "release")
TARGETS = {  # scenario -> (ratio to rsync, absolute seconds) from the speed issue
    "initial": (1.0, 0.8),
    "noop": (0.5, 0.040),
    "1%": (0.5, 0.040),
}
procs = []


def load_sandbox():
    """scripts/puppetserver_sandbox.py, the one way the tests and the bench start Puppet Server."""
    spec = importlib.util.spec_from_file_location("puppetserver_sandbox",
                                                  os.path.join(ROOT, "scripts", "puppetserver_sandbox.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cpu_seconds(pid):
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(cmd, ready, timeout=120, **kw):
    """Starts cmd; waits until ready(line) is true for a stderr line; returns (proc, match)."""
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, **kw)
    procs.append(p)
    found = {}
    ev = threading.Event()

    def reader():
        for line in p.stderr:
            if not ev.is_set():
                m = ready(line)
                if m:
                    found["m"] = m
                    ev.set()
        ev.set()

    threading.Thread(target=reader, daemon=True).start()
    if not ev.wait(timeout) or "m" not in found:
        raise SystemExit(f"error: {cmd[0]} did not start")
    return p, found["m"]


def wait_port(port, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"error: nothing listens on 127.0.0.1:{port}")


def timed(cmd, **kw):
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)
    dt = time.perf_counter() - t
    if r.returncode not in (0, 2):
        raise SystemExit(f"error: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    return dt


def stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def fmt_s(x):
    return f"{x*1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def rss(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) // 1024
    return out


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--modules", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--big", action="store_true", help="also a 50,000-file environment")
    ap.add_argument("--puppet-runs", type=int, default=3, help="runs of the Puppet columns")
    ap.add_argument("--no-puppet-server", action="store_true", help="skip the Puppet Server column")
    ap.add_argument("--shared", default=None,
                    help="a directory holding bench/gen_tree.py and bench/mutate.py (default: bench/vendor's copies)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--load-seconds", type=int, default=5)
    a = ap.parse_args()

    gen_dir = os.path.join(a.shared, "bench") if a.shared else os.path.join(ROOT, "bench", "vendor")
    gen = os.path.join(gen_dir, "gen_tree.py")
    mutate = os.path.join(gen_dir, "mutate.py")
    if not os.path.isfile(gen):
        raise SystemExit(f"error: {gen} not found (--shared DIR must hold bench/gen_tree.py)")
    if not shutil.which("rsync"):
        raise SystemExit("error: rsync is not installed (apt-get install rsync)")
    if not a.no_build:
        log("building release binaries")
        run(["cargo", "build", "--release", "--quiet", "--workspace", "--bins"], cwd=ROOT)
    work = a.work or tempfile.mkdtemp(prefix="pluginsync-bench-", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    results = {"machine": machine(), "params": vars(a), "scenarios": {}, "load": {}, "memory": {}}
    try:
        bench(a, work, gen, mutate, results)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(ROOT, "target", "bench-results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print_table(results)


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 30)
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": mem, "kernel": os.uname().release}


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


def bench(a, work, gen, mutate, results):
    envs = os.path.join(work, "envs")
    env = os.path.join(envs, "production")
    log(f"generating the environment in {env}")
    run([sys.executable, gen, "--out", env, "--files", str(a.files), "--modules", str(a.modules), "--seed", str(a.seed)],
        stdout=subprocess.DEVNULL)
    merged = os.path.join(work, "rsync", "plugins")
    merged_copy(env, merged)
    ssl = os.path.join(work, "ssl")
    run([os.path.join(REL, "pluginsync-master"), "dev-certs", "--out", ssl, "--agent", "bench-node"], stdout=subprocess.DEVNULL)

    def master_config(path, envpath):
        with open(path, "w") as f:
            f.write(f'listen = ["127.0.0.1:0"]\nenvironmentpath = ["{envpath}"]\n[tls]\n'
                    f'cert = "{ssl}/certs/localhost.pem"\nkey = "{ssl}/private_keys/localhost.pem"\n'
                    f'ca = "{ssl}/certs/ca.pem"\ncrl = "{ssl}/crl.pem"\n[http]\nshutdown_grace = "0s"\n')

    mconf = os.path.join(work, "master.toml")
    master_config(mconf, envs)
    master, m = start([os.path.join(REL, "pluginsync-master"), "serve", "--config", mconf],
                      lambda l: re.search(r"listening on 127\.0\.0\.1:(\d+)", l))
    port = int(m.group(1))
    url = f"https://localhost:{port}"
    log(f"master on {url}")

    rport = free_port()
    rconf = os.path.join(work, "rsyncd.conf")
    with open(rconf, "w") as f:
        f.write(f"use chroot = no\nsocket options = TCP_NODELAY\npid file = {work}/rsyncd.pid\n"
                f"[plugins]\npath = {merged}\nread only = yes\n")
    rsyncd = subprocess.Popen(["rsync", "--daemon", "--no-detach", f"--config={rconf}", f"--port={rport}",
                               "--address=127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(rsyncd)
    wait_port(rport)

    node = os.path.join(work, "node")
    aconf = os.path.join(work, "agent.toml")
    with open(aconf, "w") as f:
        f.write(f'servers = ["{url}"]\nlibdir = "{node}/lib"\nfactsdir = "{node}/facts.d"\nvardir = "{node}/var"\n'
                f'[tls]\nssldir = "{ssl}"\ncertname = "bench-node"\n')
    agent = [os.path.join(REL, "pluginsync-agent"), "sync", "--config", aconf]
    rnode = os.path.join(work, "rnode")
    rsync = ["rsync", "-a", "--delete", f"rsync://127.0.0.1:{rport}/plugins/", rnode + "/"]
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
    ps_env = None
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
            ps_env = os.path.join(psdir, "code", "environments", "production")
            shutil.copytree(env, ps_env, symlinks=True)
            log(f"starting Puppet Server on 127.0.0.1:{psport} (a JVM: ~20-60 s)")
            ps = sandbox.start(psdir, psport)
            procs.append(ps)
            sandbox.generate(psdir, "bench-node")
            pnode = os.path.join(work, "pnode-ps")
            tools["puppet agent -> Puppet Server"] = (
                puppet_cmd(pnode, psport, os.path.join(psdir, "ssl")), pnode, a.puppet_runs, True)
            access_log = os.path.join(psdir, "log", "access.log")
    if puppet:
        pnode = os.path.join(work, "pnode")
        tools["puppet agent -> pluginsync master"] = (puppet_cmd(pnode, port, ssl), pnode, a.puppet_runs, True)

    def requests_so_far():
        with open(access_log) as f:
            return sum(1 for _ in f)

    ps_cost = {}  # scenario -> {"requests": [...], "cpu_s": [...]}

    def timed_tool(scenario, t):
        cmd, _, _, _ = tools[t]
        # Untimed: write back what the previous tool left dirty, so no run
        # pays for another's writeback (pluginsync's syncfs would).
        os.sync()
        if t != "puppet agent -> Puppet Server":
            return timed(cmd)
        r0, c0 = requests_so_far(), cpu_seconds(ps.pid)
        dt = timed(cmd)
        cost = ps_cost.setdefault(scenario, {"requests": [], "cpu_s": []})
        cost["requests"].append(requests_so_far() - r0)
        cost["cpu_s"].append(cpu_seconds(ps.pid) - c0)
        return dt

    sc = results["scenarios"]
    for name in ("initial", "noop", "1%"):
        sc[name] = {t: [] for t in tools}
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
    for i in range(a.runs):
        log(f"1% change, run {i+1}/{a.runs}")
        for root, layout in [(env, "env"), (merged + "/lib", "merged")] + ([(ps_env, "env")] if ps_env else []):
            run([sys.executable, mutate, root, "--layout", layout, "--percent", "1", "--rev", str(i + 1)],
                stdout=subprocess.DEVNULL)
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
        results["memory"]["Puppet Server (JVM), after the Puppet runs"] = rss(ps.pid)
        ps.terminate()
        ps.wait(30)

    # Master load, with the bench node's certificate.
    load = [os.path.join(REL, "pluginsync-load"), "--ca", f"{ssl}/certs/ca.pem", "--cert", f"{ssl}/certs/bench-node.pem",
            "--key", f"{ssl}/private_keys/bench-node.pem", "--duration", f"{a.load_seconds}s"]
    q = ("recurse=true&max_files=-1&ignore=.svn&ignore=CVS&ignore=.git&ignore=.hg&links=follow"
         "&checksum_type=sha256&source_permissions=ignore&environment=production")
    listing = f"{url}/puppet/v3/file_metadatas/plugins?{q}"
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
        r = subprocess.run(load + extra, capture_output=True, text=True, check=True)
        results["load"][key] = json.loads(r.stdout)
    results["memory"]["master, bench environment, after load"] = rss(master.pid)

    if a.big:
        big_envs = os.path.join(work, "bigenvs")
        log("generating the 50,000-file environment")
        run([sys.executable, gen, "--out", os.path.join(big_envs, "production"), "--files", "50000", "--modules", "300",
             "--seed", str(a.seed), "--target-mb", "200"], stdout=subprocess.DEVNULL)
        bconf = os.path.join(work, "big-master.toml")
        master_config(bconf, big_envs)
        big, m = start([os.path.join(REL, "pluginsync-master"), "serve", "--config", bconf],
                       lambda l: re.search(r"listening on 127\.0\.0\.1:(\d+)", l), timeout=600)
        results["memory"]["master, 50,000-file environment, idle"] = rss(big.pid)
        bnode = os.path.join(work, "bignode")
        bconf_a = os.path.join(work, "big-agent.toml")
        with open(bconf_a, "w") as f:
            f.write(f'servers = ["https://localhost:{m.group(1)}"]\nlibdir = "{bnode}/lib"\nfactsdir = "{bnode}/facts.d"\n'
                    f'vardir = "{bnode}/var"\n[tls]\nssldir = "{ssl}"\ncertname = "bench-node"\n')
        bagent = [os.path.join(REL, "pluginsync-agent"), "sync", "--config", bconf_a]
        os.sync()  # the generated 200 MB is not the agent's to write back
        results["big_initial"] = stats([timed(bagent)])
        results["big_noop"] = stats([timed(bagent) for _ in range(a.runs)])
        results["memory"]["master, 50,000-file environment, after a sync"] = rss(big.pid)


def print_table(r):
    sc = r["scenarios"]
    tools = list(next(iter(sc.values())).keys())
    m = r["machine"]
    print(f"\nmachine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, Linux {m['kernel']}; "
          f"{r['params']['files']} plugin files in {r['params']['modules']} modules, seed {r['params']['seed']}, "
          f"{r['params']['runs']} runs each\n")
    ps_col = "puppet agent -> Puppet Server"
    extra = ["pluginsync / Puppet Server"] if ps_col in tools else []
    hdr = ("| scenario | " + " | ".join(f"{t} median (min–max)" for t in tools) + " | pluginsync / rsync | "
           + "".join(f"{e} | " for e in extra) + "target |")
    print(hdr)
    print("|" + "---|" * (len(tools) + 3 + len(extra)))
    for name, per in sc.items():
        cells = [f"{fmt_s(per[t]['median'])} ({fmt_s(per[t]['min'])}–{fmt_s(per[t]['max'])})" for t in tools]
        ratio = per["pluginsync"]["median"] / per["rsync"]["median"]
        tr, ta = TARGETS[name]
        ok = "met" if ratio <= tr else "MISSED"
        ps_ratio = "".join(f"{per['pluginsync']['median'] / per[ps_col]['median']:.3f}× | " for _ in extra)
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio:.2f}× | {ps_ratio}≤ {tr}× rsync: {ok} |")
    ps = r["puppet_server"]
    if "note" in ps:
        print(f"\nPuppet Server: {ps['note']}")
    else:
        print("\nPuppet Server's cost per `puppet plugin download` (median): "
              + "; ".join(f"{k}: {v['requests']:.0f} requests, {v['cpu_s']:.1f} s server CPU" for k, v in ps.items()))
    print("\n| master load (HTTPS, client certificate, HTTP/1.1 keep-alive) | req/s | p50 | p99 | errors |")
    print("|---|---|---|---|---|")
    for k, v in r["load"].items():
        print(f"| {k} | {v['rps']:.0f} | {v['p50_ms']:.2f} ms | {v['p99_ms']:.2f} ms | {v['errors']} |")
    print("\n| memory | RSS | peak RSS |")
    print("|---|---|---|")
    for k, v in r["memory"].items():
        print(f"| {k} | {v.get('VmRSS')} MiB | {v.get('VmHWM')} MiB |")
    if "big_noop" in r:
        print(f"\nagent on the 50,000-file tree: initial {fmt_s(r['big_initial']['median'])}, "
              f"no-op median {fmt_s(r['big_noop']['median'])} ({fmt_s(r['big_noop']['min'])}–{fmt_s(r['big_noop']['max'])}); target ≤ 300 ms")


if __name__ == "__main__":
    main()
