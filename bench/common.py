"""Helpers every bench scenario shares: processes, CPU and memory from /proc, timing, TLS requests.

Imported by bench/run.py and its scenario modules (bench/fleet.py, bench/busy.py, bench/envs.py);
stdlib only.
"""
import http.client, os, shutil, socket, ssl, statistics, subprocess, sys, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The binaries measured: the release build (PLUGINSYNC_BENCH_BINDIR names another directory, e.g.
# target/debug to try the bench itself out; its figures then mean nothing).
REL = os.environ.get("PLUGINSYNC_BENCH_BINDIR") or os.path.join(ROOT, "target", "release")
MASTER = os.path.join(REL, "pluginsync-master")
AGENT = os.path.join(REL, "pluginsync-agent")
LOAD = os.path.join(REL, "pluginsync-load")


def unit_environment():
    """The `Environment=` settings of packaging/pluginsync-master.service: the bench runs the master
    as the package does (its malloc settings, docs/operating.md#memory-and-tasks)."""
    out = {}
    with open(os.path.join(ROOT, "packaging", "pluginsync-master.service")) as f:
        for line in f:
            if line.startswith("Environment="):
                k, _, v = line.strip()[len("Environment="):].partition("=")
                out[k] = v
    return out


# The environment every bench master runs with.
MASTER_ENV = {**os.environ, **unit_environment()}
# The query a pluginsync agent (and Puppet's) sends for a recursive listing (docs/protocol.md §1.2).
LISTING_QUERY = ("recurse=true&max_files=-1&ignore=.svn&ignore=CVS&ignore=.git&ignore=.hg&links=follow"
                 "&checksum_type=sha256&source_permissions=ignore")

# Every process a scenario starts; run.py stops what is still running when the bench ends.
procs = []


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def cpu_seconds(pid):
    """User + system CPU time of a process so far (every thread, live and exited), in seconds.

    /proc counts it in clock ticks (10 ms here): a figure per run is a difference over many runs
    divided by their number, never one run's difference."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid):
    """{thread id: CPU nanoseconds so far} from /proc/<pid>/task/*/schedstat (exact, unlike the
    10 ms ticks of /proc/<pid>/stat). Threads that exited are gone from it; see cpu_between."""
    out = {}
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                out[tid] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def cpu_between(before, after):
    """CPU seconds a process spent between two thread_cpu() snapshots: threads alive at the end
    count from their value at the start (or from 0 if born since). A thread that exited in between
    is missed; the master's are its runtime's workers (they live as long as it) and blocking-pool
    threads that exit only after 10 s idle, so an exiting one did no work in between."""
    return sum(v - before.get(t, 0) for t, v in after.items()) / 1e9


def wait_idle(pid, window=0.1, busy=0.002, limit=5.0):
    """Waits (at most `limit` s) until the process uses less than `busy` s of CPU in `window` s,
    so work left from an untimed step (a re-index, a priming request) is not charged to the next
    measured run."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        a = thread_cpu(pid)
        time.sleep(window)
        if cpu_between(a, thread_cpu(pid)) < busy:
            return


def rss(pid):
    """VmRSS and VmHWM (peak) of a process, in MiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) // 1024
    return out


def meminfo_mib(key):
    """A /proc/meminfo line (e.g. Dirty, Writeback) in MiB."""
    with open("/proc/meminfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k == key:
                return int(v.split()[0]) / 1024
    return 0.0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(cmd, ready, timeout=120, **kw):
    """Starts cmd; waits until ready(line) is true for a stderr line; returns (proc, match).

    The rest of its stderr is read and dropped, so a chatty server never blocks on a full pipe."""
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, **kw)
    procs.append(p)
    found = {}
    ev = threading.Event()
    tail = []

    def reader():
        for line in p.stderr:
            if not ev.is_set():
                tail.append(line)
                del tail[:-5]
                m = ready(line)
                if m:
                    found["m"] = m
                    ev.set()
        ev.set()

    threading.Thread(target=reader, daemon=True).start()
    if not ev.wait(timeout) or "m" not in found:
        raise SystemExit(f"error: {cmd[0]} did not start: {''.join(tail).strip()}")
    return p, found["m"]


def stop(p, timeout=10):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


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
    """Runs cmd; returns its wall time. Exit 0 and 2 (Puppet's "changes made") are success."""
    return timed_rusage(cmd, **kw)[0]


def timed_rusage(cmd, env=None):
    """Runs cmd; returns (wall seconds, its own user+system CPU seconds)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode not in (0, 2):
        raise SystemExit(f"error: {' '.join(cmd)} exited {p.returncode}: {err.decode(errors='replace').strip()}")
    return dt, ru.ru_utime + ru.ru_stime


def stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def fmt_s(x):
    return f"{x*1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def fmt_bytes(n):
    if n < 10_000:
        return f"{n:,.0f} B"
    if n < 10_000_000:
        return f"{n/1000:,.1f} KB"
    return f"{n/1e6:,.1f} MB"


def tls_context(ssldir, certname):
    """A client context trusting the ssldir's CA, presenting certname's certificate (docs/protocol.md §5.3)."""
    ctx = ssl.create_default_context(cafile=os.path.join(ssldir, "certs", "ca.pem"))
    ctx.load_cert_chain(os.path.join(ssldir, "certs", f"{certname}.pem"),
                        os.path.join(ssldir, "private_keys", f"{certname}.pem"))
    return ctx


def https_get(conn, path, headers=None):
    """One GET on a kept-alive http.client connection; returns (status, body bytes)."""
    conn.request("GET", path, headers=headers or {})
    r = conn.getresponse()
    return r.status, r.read()


def https_conn(port, ctx, timeout=300):
    return http.client.HTTPSConnection("localhost", port, context=ctx, timeout=timeout)


def master_config(path, envpath, ssl_dir, listen="127.0.0.1:0", publish=None, metrics=None, extra="", http=""):
    """Writes a master config serving envpath with ssl_dir's `localhost` certificate; `http` is added to [http].

    Only keys today's main has are written, so the bench runs on any later main as well."""
    crl = os.path.join(ssl_dir, "crl.pem")
    with open(path, "w") as f:
        f.write(f'listen = ["{listen}"]\nenvironmentpath = ["{envpath}"]\n[tls]\n'
                f'cert = "{ssl_dir}/certs/localhost.pem"\nkey = "{ssl_dir}/private_keys/localhost.pem"\n'
                f'ca = "{ssl_dir}/certs/ca.pem"\n' + (f'crl = "{crl}"\n' if os.path.exists(crl) else "")
                + '[http]\nshutdown_grace = "0s"\n' + http)
        if publish:
            f.write(f'[index]\npublish = "{publish}"\n')
        if metrics:
            f.write(f'[metrics]\nlisten = "{metrics}"\n')
        f.write(extra)


def one_node_many_connections(envpath, ssl_dir, work):
    """The [http] line that lets one certificate hold the load generator's 64 connections.

    The load runs present the bench node's certificate on every connection, which the master's
    `max_connections_per_client` (4 by default, docs/master.md#connection-limits) would refuse past
    the fourth busy one; "" on a main that does not know the key (its `check` refuses it as unknown)."""
    line = "max_connections_per_client = 0\n"
    trial = os.path.join(work, "master-trial.toml")
    master_config(trial, envpath, ssl_dir, http=line)
    r = subprocess.run([MASTER, "check", "--config", trial], capture_output=True, text=True)
    return "" if "unknown field" in r.stderr + r.stdout else line


def agent_config(path, url, node, ssl_dir, certname="bench-node"):
    """The bench node's agent.toml. Fact health (docs/loading.md#fact-health) is off: it runs
    Facter on the changed facts after the sync, work rsync and the baselines do not do, so with it
    the figures would time Facter's start on this machine, not the sync. The `pluginsync` fact
    (docs/agent.md#the-pluginsync-fact) is not written: a bench node is not this host, whose
    Facter directory it would otherwise write."""
    with open(path, "w") as f:
        f.write(f'servers = ["{url}"]\nlibdir = "{node}/lib"\nfactsdir = "{node}/facts.d"\nvardir = "{node}/var"\n'
                f'[tls]\nssldir = "{ssl_dir}"\ncertname = "{certname}"\n[facts]\ncheck = false\nexternal_dir = false\n')
    return [AGENT, "sync", "--config", path]


def start_master(conf, timeout=120):
    """Starts `pluginsync-master serve`; returns (proc, port) once it says it listens."""
    import re
    p, m = start([MASTER, "serve", "--config", conf],
                 lambda l: re.search(r"listening on 127\.0\.0\.1:(\d+)", l), timeout=timeout, env=MASTER_ENV)
    return p, int(m.group(1))


def reindex(conf, port, env):
    """`pluginsync-master reindex ENV`: returns once the master serves the new index (docs/protocol.md §1.10)."""
    r = subprocess.run([MASTER, "reindex", "--config", conf, "--server", f"https://localhost:{port}", env],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"error: pluginsync-master reindex {env} exited {r.returncode}: {r.stderr.strip()}")


def rmtree(path):
    shutil.rmtree(path, ignore_errors=True)
