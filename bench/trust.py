"""Signing on vs off (BENCHMARKS.md#signing-trust-benchtrustpy): what signed generations (docs/trust.md)
cost a master and a node, in one run, on the bench's tree (--files, 3,000 by default).

Two setups, fresh each, both serving the bench environment (`index.publish = "explicit"`, so only
`pluginsync-master reindex` re-indexes), each with one node of its own (`pluginsync-agent sync`, a new
process each run, as under a timer):

  off  one master and one node, no `[trust]`;
  on   the same with the operator's workflow of docs/trust.md#quick-start and the real `tuftool`:
       throwaway keys and an empty repository from scripts/trust-quickstart.sh, every generation
       signed by scripts/sign-generation.sh into the master's `[trust] metadata` (outside the timed
       runs), the master with `[trust] root` (it publishes only signed generations,
       docs/trust.md#publishing-only-signed-generations), the node with `[trust] root`.

Without `tuftool` (`cargo install --locked tuftool`) the scenario is SKIPPED, visibly.

The runs alternate between the setups as the speed scenario's tools do, and swap which goes first on
every round: the initial sync (--runs, each into a fresh node, after one untimed warm-up), --trust-runs
no-op runs (after one untimed), then --trust-change-runs runs after a 1 % change (bench/vendor/mutate.py;
both masters re-indexed and, for `on`, the change signed first; the first change after a first sync,
which fills the node's standby once, is untimed). Figures per setup:

  - master CPU per no-op run: the master's user+system CPU from /proc/<pid>/stat over all no-op runs
    (what happens between them included), divided by their number; and, as a check, the exact per-run
    CPU (per-thread schedstat, from the agent's start to its exit, the master idle before each run);
  - the agent's wall and CPU time (medians) of the initial sync, the no-op and the 1 % runs;
  - master CPU per change (the re-index; for `on` also reading and verifying the new signed metadata).

The cost of verifying the generation is stated on its own: the initial sync's difference on - off,
and the agent's own timing of it. Every run of both setups logs the agent's phase lines (debug, JSON:
`RUST_LOG=warn,pluginsync_agent::sync=debug --log-format json`, the same lines for both); under
`[trust]` the verification is the time from the phase before `generation verified` (the manifest
checked, or on a no-op the generation assigned) to it: the TUF refresh (timestamp -> snapshot ->
targets, fetched or read back from `<vardir>/trust/`; on a no-op whose files are unchanged, the last
load's record, docs/trust.md#requests-per-run) and the target check. After a change the refresh runs
while the manifest is fetched, so the figure is what is left of it once the manifest is checked.

Imported by bench/run.py (`--scenarios trust`: not in the default run).
"""
import json, os, re, shutil, statistics, subprocess, time

from common import (MASTER, ROOT, agent_config, cpu_between, cpu_seconds, fmt_s, log, master_config, reindex,
                    start_master, stats, stop, thread_cpu, wait_idle)

NOOP_TARGET, CHANGE_TARGET, CPU_TARGET = 1.1, 1.15, 1.1
ENV = "production"
# The agent's phase lines (agent/src/sync.rs `phase`), the same for both setups.
AGENT_ENV = {**os.environ, "RUST_LOG": "warn,pluginsync_agent::sync=debug"}
LOG_FLAGS = ["--log-format", "json"]


def tuftool():
    """`tuftool` on PATH or in ~/.cargo/bin, or None."""
    found = shutil.which("tuftool")
    cargo = os.path.expanduser("~/.cargo/bin/tuftool")
    return found or (cargo if os.access(cargo, os.X_OK) else None)


def phases(stderr):
    """[(phase, elapsed seconds)] from the agent's JSON debug lines, in order."""
    out = []
    for line in stderr.splitlines():
        try:
            fields = json.loads(line).get("fields", {})
        except (ValueError, AttributeError):
            continue
        if "elapsed_ms" in fields:
            out.append((fields.get("message"), float(fields["elapsed_ms"]) / 1000))
    return out


def verification(ph):
    """Seconds from the phase before `generation verified` to it, or None."""
    for i, (name, t) in enumerate(ph):
        if name == "generation verified" and i > 0:
            return t - ph[i - 1][1]
    return None


class Setup:
    """One master and its node; `tuf` (the quick start's directory) makes it the signed setup."""

    def __init__(self, ctx, name, tool=None, tuf=None):
        self.ctx, self.name, self.tool, self.tuf = ctx, name, tool, tuf
        self.dir = os.path.join(ctx.work, "trust", name)
        os.makedirs(self.dir)
        self.conf = os.path.join(self.dir, "master.toml")
        extra = ""
        if tuf:
            self.served = os.path.join(self.dir, "metadata")
            os.makedirs(self.served)
            extra = f'[trust]\nroot = "{tuf}/root.json"\nmetadata = "{self.served}"\n'
        master_config(self.conf, ctx.envs, ctx.ssl, publish="explicit", extra=extra)
        self.signing, self.manifest_bytes = [], None
        if tuf:
            self.sign()  # before the start: a master under [trust] root publishes only a signed tree
        self.master, self.port = start_master(self.conf)
        self.node = os.path.join(self.dir, "node")
        agent_toml = os.path.join(self.dir, "agent.toml")
        self.cmd = agent_config(agent_toml, f"https://localhost:{self.port}", self.node, ctx.ssl) + LOG_FLAGS
        if tuf:
            with open(agent_toml, "a") as f:
                f.write(f'[trust]\nroot = "{tuf}/root.json"\n')
        self.runs = {"initial": [], "noop": [], "1%": []}
        self.per_change = []

    def sign(self):
        """scripts/sign-generation.sh for the tree as it is now, published to the master's metadata."""
        keys = os.path.join(self.tuf, "keys")
        cmd = [os.path.join(ROOT, "scripts", "sign-generation.sh"), "--config", self.conf,
               "--repo", os.path.join(self.tuf, "repo"), "--publish", self.served,
               "--targets-key", f"{keys}/targets.pem", "--snapshot-key", f"{keys}/snapshot.pem",
               "--timestamp-key", f"{keys}/timestamp.pem", ENV]
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True,
                           env={**os.environ, "PLUGINSYNC_MASTER": MASTER, "TUFTOOL": self.tool})
        self.signing.append(time.perf_counter() - t)
        m = re.search(rf"signed {ENV} generation ([0-9a-f]{{64}}) as (\S+),", r.stdout)
        if r.returncode or not m:
            raise SystemExit(f"error: sign-generation.sh exited {r.returncode}: {(r.stderr or r.stdout).strip()}")
        self.manifest_bytes = os.path.getsize(os.path.join(self.tuf, "repo", "manifests", m.group(2)))

    def change(self):
        """The tree changed: signed (on), re-indexed; the master's CPU for it (idle before and after)."""
        wait_idle(self.master.pid)
        c0 = thread_cpu(self.master.pid)
        if self.tuf:
            self.sign()
        reindex(self.conf, self.port, ENV)
        wait_idle(self.master.pid)
        return cpu_between(c0, thread_cpu(self.master.pid))

    def run(self, kind=None):
        """One agent run (kept under `kind` unless None): wall, agent CPU, exact master CPU, verification."""
        pid = self.master.pid
        wait_idle(pid)
        c0 = thread_cpu(pid)
        t = time.perf_counter()
        p = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=AGENT_ENV, text=True)
        err = p.stderr.read()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        master_cpu = cpu_between(c0, thread_cpu(pid))
        p.stderr.close()
        code = p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        if code not in (0, 2):
            last = err.strip().splitlines()[-1:] or [""]
            raise SystemExit(f"error: [{self.name}] {' '.join(self.cmd)} exited {code}: {last[0]}")
        verify = verification(phases(err))
        if self.tuf and verify is None:
            raise SystemExit(f"error: [{self.name}] the agent under [trust] logged no `generation verified`")
        out = {"wall_s": wall, "agent_cpu_s": ru.ru_utime + ru.ru_stime, "master_cpu_s": master_cpu,
               "verify_s": verify}
        if kind:
            self.runs[kind].append(out)
        return out

    def summary(self, noop_ticks_s):
        out = {"master_cpu_noop_s": noop_ticks_s / len(self.runs["noop"]),
               "master_cpu_per_change_s": statistics.median(self.per_change)}
        for kind, rs in self.runs.items():
            out[kind] = {"wall": stats([r["wall_s"] for r in rs]), "agent_cpu": stats([r["agent_cpu_s"] for r in rs]),
                         "master_cpu_mean_s": statistics.mean(r["master_cpu_s"] for r in rs)}
            if self.tuf:
                out[kind]["verify"] = stats([r["verify_s"] for r in rs])
        if self.tuf:
            out["signing_s"] = stats(self.signing)
            out["manifest_bytes"] = self.manifest_bytes
        return out


def alternate(setups, i):
    """The setups in round i's order: off first on even rounds, on first on odd ones."""
    return setups if i % 2 == 0 else setups[::-1]


def measure(ctx, setups, move_aside):
    a = ctx.a
    log(f"trust: initial sync, warm-up, then {a.runs} runs")
    for i in range(a.runs + 1):
        for s in alternate(setups, i):
            move_aside(s.node, ctx.work)
            os.sync()  # untimed: no run pays for another's writeback
            s.run("initial" if i else None)
    for s in setups:
        s.run()  # untimed: what a node keeps between runs
    log(f"trust: {a.trust_runs} no-op runs each")
    ticks0 = [cpu_seconds(s.master.pid) for s in setups]
    for i in range(a.trust_runs):
        for s in alternate(setups, i):
            s.run("noop")
    noop_ticks = [cpu_seconds(s.master.pid) - t for s, t in zip(setups, ticks0)]
    log(f"trust: the first change after a first sync (untimed), then {a.trust_change_runs} 1 % changes")
    for i in range(a.trust_change_runs + 1):
        ctx.mutate()
        for s in setups:
            cpu = s.change()
            if i:
                s.per_change.append(cpu)
        for s in alternate(setups, i):
            os.sync()
            s.run("1%" if i else None)
    return noop_ticks


def run(ctx, results, move_aside):
    a = ctx.a
    tr = results["trust"] = {"files": a.files, "modules": a.modules, "initial_runs": a.runs,
                             "noop_runs": a.trust_runs, "change_runs": a.trust_change_runs,
                             "loadavg_start": os.getloadavg()}
    if min(a.runs, a.trust_runs, a.trust_change_runs) < 1:
        raise SystemExit("error: --runs, --trust-runs and --trust-change-runs must be at least 1")
    tool = tuftool()
    if not tool:
        tr["skipped"] = "tuftool is not installed (cargo install --locked tuftool)"
        log(f"trust: SKIPPED: {tr['skipped']}")
        return
    tuf = os.path.join(ctx.work, "trust", "tuf")
    log("trust: throwaway keys and an empty repository (scripts/trust-quickstart.sh)")
    r = subprocess.run([os.path.join(ROOT, "scripts", "trust-quickstart.sh"), tuf], capture_output=True, text=True,
                       env={**os.environ, "TUFTOOL": tool})
    if r.returncode:
        raise SystemExit(f"error: trust-quickstart.sh exited {r.returncode}: {r.stderr.strip()}")
    setups = []
    try:
        setups.append(Setup(ctx, "off"))
        setups.append(Setup(ctx, "on", tool, tuf))
        noop_ticks = measure(ctx, setups, move_aside)
        for s, ticks in zip(setups, noop_ticks):
            tr[s.name] = s.summary(ticks)
    finally:
        for s in setups:
            stop(s.master)
    tr["loadavg_end"] = os.getloadavg()
    off, on = tr["off"], tr["on"]
    tr["ratios"] = {"master_cpu_noop": on["master_cpu_noop_s"] / off["master_cpu_noop_s"],
                    "noop": on["noop"]["wall"]["median"] / off["noop"]["wall"]["median"],
                    "1%": on["1%"]["wall"]["median"] / off["1%"]["wall"]["median"],
                    "initial": on["initial"]["wall"]["median"] / off["initial"]["wall"]["median"]}
    shutil.rmtree(os.path.join(ctx.work, "trust"), ignore_errors=True)


def print_table(r):
    t = r.get("trust")
    if not t:
        return
    if "skipped" in t:
        print(f"\nsigning (trust): SKIPPED: {t['skipped']}")
        return
    if "ratios" not in t:
        return
    off, on, q = t["off"], t["on"], t["ratios"]
    ms = lambda x: f"{x*1000:.2f} ms"
    med = lambda s: f"{fmt_s(s['median'])} ({fmt_s(s['min'])}–{fmt_s(s['max'])})"
    load = lambda x: "/".join(f"{v:.1f}" for v in x)
    print(f"\n| signing, {t['files']:,} files: off / on, alternated in one run | off | on | on / off | target |")
    print("|---|---|---|---|---|")
    rows = [
        (f"master CPU per no-op run (/proc/<pid>/stat over {t['noop_runs']} runs)", ms(off["master_cpu_noop_s"]),
         ms(on["master_cpu_noop_s"]), f"{q['master_cpu_noop']:.2f}×", f"≤ {CPU_TARGET}×"),
        ("… per run, exact (per-thread schedstat, mean)", ms(off["noop"]["master_cpu_mean_s"]),
         ms(on["noop"]["master_cpu_mean_s"]), f"{on['noop']['master_cpu_mean_s'] / off['noop']['master_cpu_mean_s']:.2f}×",
         "–"),
        (f"agent no-op wall time (median of {t['noop_runs']})", med(off["noop"]["wall"]), med(on["noop"]["wall"]),
         f"{q['noop']:.2f}×", f"≤ {NOOP_TARGET}×"),
        (f"agent 1 % change wall time (median of {t['change_runs']})", med(off["1%"]["wall"]), med(on["1%"]["wall"]),
         f"{q['1%']:.2f}×", f"≤ {CHANGE_TARGET}×"),
        (f"initial sync wall time (median of {t['initial_runs']})", med(off["initial"]["wall"]),
         med(on["initial"]["wall"]), f"{q['initial']:.2f}×", "–"),
        ("agent CPU, no-op / 1 % / initial (median)",
         *(" / ".join(fmt_s(s[k]["agent_cpu"]["median"]) for k in ("noop", "1%", "initial")) for s in (off, on)),
         "", "–"),
        ("master CPU per 1 % run (mean, exact)", ms(off["1%"]["master_cpu_mean_s"]), ms(on["1%"]["master_cpu_mean_s"]),
         f"{on['1%']['master_cpu_mean_s'] / off['1%']['master_cpu_mean_s']:.2f}×", "–"),
        ("master CPU per change, shared by all nodes (re-index; on: + the new signed metadata)",
         ms(off["master_cpu_per_change_s"]), ms(on["master_cpu_per_change_s"]),
         f"{on['master_cpu_per_change_s'] / off['master_cpu_per_change_s']:.2f}×", "–"),
    ]
    for row in rows:
        print("| " + " | ".join(row) + " |")
    v = {k: on[k]["verify"] for k in ("initial", "noop", "1%")}
    diff = on["initial"]["wall"]["median"] - off["initial"]["wall"]["median"]
    fine = lambda s: f"{s['median']*1000:.1f} ms ({s['min']*1000:.1f}–{s['max']*1000:.1f})"
    print(f"\nverifying a {t['files']:,}-file generation (its manifest {on['manifest_bytes']:,} B): the agent's own "
          f"timing, to `generation verified`, median (min–max): initial sync {fine(v['initial'])}, no-op "
          f"{fine(v['noop'])}, after a 1 % change {fine(v['1%'])}; initial sync on − off {diff*1000:+.0f} ms")
    print(f"signing a change (scripts/sign-generation.sh, outside the timed runs): median {fmt_s(on['signing_s']['median'])}"
          f"; load average {load(t['loadavg_start'])} at the start, {load(t['loadavg_end'])} at the end")


def targets(r, add):
    """The signing rows of the Targets table (bench/run.py `targets`)."""
    t = r.get("trust", {})
    skipped = t.get("skipped")
    off, on, q = t.get("off", {}), t.get("on", {}), t.get("ratios", {})

    def ratio(label, key, limit, figure):
        def fn():
            if skipped:
                return f"SKIPPED: {skipped}", "SKIPPED"
            return f"{figure()} ({q[key]:.2f}×)", q[key] <= limit
        add(f"signing on: {label} ≤ {limit}× off", fn)

    ms = lambda x: f"{x*1000:.2f} ms"
    ratio("master CPU per no-op run", "master_cpu_noop", CPU_TARGET,
          lambda: f"{ms(on['master_cpu_noop_s'])} vs {ms(off['master_cpu_noop_s'])}")
    ratio("agent no-op wall time", "noop", NOOP_TARGET,
          lambda: f"{fmt_s(on['noop']['wall']['median'])} vs {fmt_s(off['noop']['wall']['median'])}")
    ratio("agent 1 % change wall time", "1%", CHANGE_TARGET,
          lambda: f"{fmt_s(on['1%']['wall']['median'])} vs {fmt_s(off['1%']['wall']['median'])}")

    def cost():
        if skipped:
            return f"SKIPPED: {skipped}", "SKIPPED"
        v = {k: on[k]["verify"]["median"] for k in ("initial", "noop", "1%")}
        diff = on["initial"]["wall"]["median"] - off["initial"]["wall"]["median"]
        return (f"initial sync {diff*1000:+.0f} ms on − off; the agent's verification {ms(v['initial'])} "
                f"(initial), {ms(v['noop'])} (no-op), {ms(v['1%'])} (1 %)", None)
    add(f"signing on: the cost of verifying a {t.get('files', 3000):,}-file generation (no target)", cost)
