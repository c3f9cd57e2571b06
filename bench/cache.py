"""A cache in front of the masters (docs/cache.md; docs/development.md#benchmarks): bytes the masters send for a 1 % change to --cache-nodes nodes, with nginx's cache and without.

Two masters serve the bench environment (`index.publish = "explicit"`, a `[proxy]` listener, `/metrics`).
Each setup has nodes of its own, with certnames of their own (dev-certs, ECDSA), seeded from one synced
node (its libdir and facts hard-linked, its vardir copied) and warmed by one untimed no-op run each;
then 30 files change (bench/vendor/mutate.py), both masters re-index, and every node runs
`pluginsync-agent sync`, 8 at a time:

  without  half the nodes on each master's mTLS port
  with     every node through nginx with packaging/nginx-pluginsync-cache.conf as written, in front of
           both masters' [proxy] listeners (plain HTTP on loopback)

Per setup: the response body bytes both masters sent during the change runs (their
`pluginsync_master_http_response_bytes_total`, by endpoint: content = blob, blob_batch, file_content;
listings = file_metadatas; generations = the per-node answer and manifests), per node, and the wall time of the fleet's runs; with the cache, nginx's
HIT and MISS counts for blobs (its `pluginsync_cache` log). Needs nginx (skipped with a note otherwise).

Imported by bench/run.py (`--scenarios cache`, or `--fleet`).
"""
import json, os, re, shutil, subprocess, threading, time, urllib.request

from common import (AGENT, MASTER, MASTER_ENV, ROOT, agent_config, free_port, log, master_config, procs, reindex, rmtree,
                    start, stop, timed_rusage, wait_port)

PARALLEL = 8
CONTENT = ("blob", "blob_batch", "file_content")
LISTINGS = ("file_metadatas", "file_metadata")
GENERATIONS = ("assignment", "generation")  # the per-node answer, manifests


def node_name(i):
    return f"cache-node{i:03d}"


def start_master(conf):
    """`pluginsync-master serve`; (proc, mTLS port): the first `listening on` line that is not the proxy's."""
    p, m = start([MASTER, "serve", "--config", conf],
                 lambda l: None if "proxy listening" in l else re.search(r"listening on 127\.0\.0\.1:(\d+)", l),
                 env=MASTER_ENV)
    return p, int(m.group(1))


def response_bytes(metrics_port):
    """{endpoint: body bytes sent} from a master's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for m in re.finditer(r'^pluginsync_master_http_response_bytes_total\{endpoint="([^"]+)"\} (\S+)$', text, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


def start_nginx(work, ssl_dir, proxies):
    """nginx with the shipped file, its four includes written with loopback values (as tests/e2e/nginx_cache.rs)."""
    d = os.path.join(work, "nginx-cache")
    inc = os.path.join(d, "pluginsync-cache")
    os.makedirs(inc, exist_ok=True)
    port = free_port()
    files = {
        "store.conf": f"proxy_cache_path {d}/cache levels=1:2 keys_zone=pluginsync:16m max_size=2g "
                      "inactive=1d use_temp_path=off;\n",
        "site.conf": f"listen 127.0.0.1:{port} ssl;\nssl_certificate {ssl_dir}/certs/localhost.pem;\n"
                     f"ssl_certificate_key {ssl_dir}/private_keys/localhost.pem;\n"
                     f"ssl_client_certificate {ssl_dir}/certs/ca.pem;\nssl_crl {ssl_dir}/crl.pem;\n"
                     f"access_log {d}/cache.log pluginsync_cache;\n",
        "masters.conf": "".join(f"server {a} max_fails=1 fail_timeout=5s;\n" for a in proxies),
        "hop.conf": "set $pluginsync_hop http;\n",
    }
    for name, text in files.items():
        with open(os.path.join(inc, name), "w") as f:
            f.write(text)
    temp = "".join(f"    {t}_temp_path {d}/{t};\n" for t in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    with open(os.path.join(d, "nginx.conf"), "w") as f:
        f.write(f"worker_processes 1;\nevents {{ worker_connections 1024; }}\nhttp {{\n    access_log off;\n{temp}"
                f"    include {ROOT}/packaging/nginx-pluginsync-cache.conf;\n}}\n")
    p = subprocess.Popen([shutil.which("nginx"), "-p", d, "-c", os.path.join(d, "nginx.conf"), "-e",
                          os.path.join(d, "error.log"), "-g", f"daemon off; master_process on; pid {d}/nginx.pid;"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(p)
    wait_port(port)
    return p, port, os.path.join(d, "cache.log")


def cache_statuses(log_path, skip):
    """HIT/MISS counts of blob requests in nginx's log from line `skip` on."""
    counts = {}
    with open(log_path) as f:
        for line in list(f)[skip:]:
            e = json.loads(line)
            if e["uri"].startswith("/pluginsync/v1/blobs/sha256/"):
                counts[e["cache"] or "-"] = counts.get(e["cache"] or "-", 0) + 1
    return counts


def lines(path):
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def run_all(cmds):
    """Runs every command, PARALLEL at a time; returns the wall time of all."""
    it = iter(cmds)
    lock = threading.Lock()
    errors = []

    def worker():
        while True:
            with lock:
                cmd = next(it, None)
            if cmd is None:
                return
            try:
                timed_rusage(cmd)
            except SystemExit as e:  # the agent's failure, kept for the report
                errors.append(str(e))

    t = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(PARALLEL)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise SystemExit(f"{len(errors)} agent runs failed, the first: {errors[0]}")
    return time.perf_counter() - t


def nodes(work, ssl_dir, setup, urls, n):
    """n nodes for `setup`, node i on urls[i % len(urls)], each seeded from one synced node per URL; their commands."""
    seeds = {}
    for url in urls:
        seed = os.path.join(work, f"cache-{setup}-seed{len(seeds)}")
        cmd = agent_config(seed + ".toml", url, seed, ssl_dir, node_name(0))
        timed_rusage(cmd)
        seeds[url] = seed
    cmds = []
    for i in range(n):
        url = urls[i % len(urls)]
        node = os.path.join(work, f"cache-{setup}", node_name(i))
        os.makedirs(node)
        for sub in ("lib", "facts.d"):
            subprocess.run(["cp", "-al", os.path.join(seeds[url], sub), os.path.join(node, sub)], check=True)
        shutil.copytree(os.path.join(seeds[url], "var"), os.path.join(node, "var"))
        cmds.append(agent_config(node + ".toml", url, node, ssl_dir, node_name(i)))
    return cmds


def measure(ctx, setup, cmds, masters, nginx_log=None):
    """Warm-up no-ops, then one 1 % change and every node's run; what the masters sent meanwhile."""
    log(f"cache [{setup}]: {len(cmds)} nodes, warm-up no-op runs")
    run_all(cmds)
    changed = ctx.mutate()
    for conf, port, _ in masters:
        reindex(conf, port, "production")
    before = [response_bytes(mport) for _, _, mport in masters]
    skip = lines(nginx_log) if nginx_log else 0
    log(f"cache [{setup}]: {len(cmds)} nodes after a 1 % change")
    wall = run_all(cmds)
    sent = {}
    for (_, _, mport), b in zip(masters, before):
        for k, v in response_bytes(mport).items():
            sent[k] = sent.get(k, 0) + v - b.get(k, 0)
    content = sum(sent.get(k, 0) for k in CONTENT)
    listings = sum(sent.get(k, 0) for k in LISTINGS)
    generations = sum(sent.get(k, 0) for k in GENERATIONS)
    out = {"nodes": len(cmds), "changed_files": changed["changed"], "changed_content_bytes": changed["content_bytes"],
           "master_bytes": sum(sent.values()), "content_bytes": content, "listing_bytes": listings,
           "generation_bytes": generations,
           "per_node_bytes": sum(sent.values()) / len(cmds), "by_endpoint": sent, "wall_s": wall}
    if nginx_log:
        out["nginx_blobs"] = cache_statuses(nginx_log, skip)
    return out


def run(ctx, results):
    """results["cache"] = {without, with}, or a note when nginx is missing."""
    a = ctx.a
    if not shutil.which("nginx"):
        results["cache"] = {"note": "nginx is not installed (apt-get install nginx)"}
        log("cache: SKIPPED, nginx is not installed")
        return
    ssl_dir = os.path.join(ctx.work, "ssl-cache")
    subprocess.run([MASTER, "dev-certs", "--out", ssl_dir] + [x for i in range(a.cache_nodes)
                                                             for x in ("--agent", node_name(i))],
                   check=True, stdout=subprocess.DEVNULL)
    masters, proxies = [], []
    for i in range(2):
        conf = os.path.join(ctx.work, f"cache-master{i}.toml")
        pport, mport = free_port(), free_port()
        master_config(conf, ctx.envs, ssl_dir, publish="explicit", metrics=f"127.0.0.1:{mport}",
                      extra=f'[proxy]\nlisten = ["127.0.0.1:{pport}"]\ntrusted = ["127.0.0.0/8"]\n')
        p, port = start_master(conf)
        masters.append((conf, port, mport))
        proxies.append(f"127.0.0.1:{pport}")
    nginx, nport, nginx_log = start_nginx(ctx.work, ssl_dir, proxies)
    out = results.setdefault("cache", {})
    try:
        direct = [f"https://localhost:{port}" for _, port, _ in masters]
        out["without"] = measure(ctx, "without", nodes(ctx.work, ssl_dir, "without", direct, a.cache_nodes), masters)
        rmtree(os.path.join(ctx.work, "cache-without"))
        cached = nodes(ctx.work, ssl_dir, "with", [f"https://localhost:{nport}"], a.cache_nodes)
        out["with"] = measure(ctx, "with", cached, masters, nginx_log)
        rmtree(os.path.join(ctx.work, "cache-with"))
    finally:
        stop(nginx)


def print_table(r):
    c = r.get("cache")
    if not c:
        return
    if "note" in c:
        print(f"\ncache: {c['note']}")
        return
    if "with" not in c:
        return
    w, wo = c["with"], c["without"]
    kb = lambda x: f"{x/1000:,.1f} KB"
    print(f"\n| {w['nodes']} nodes, one 1 % change ({w['changed_files']} files, {kb(w['changed_content_bytes'])}) "
          "| without a cache | through nginx's cache |")
    print("|---|---|---|")
    print(f"| body bytes both masters sent | {kb(wo['master_bytes'])} | {kb(w['master_bytes'])} |")
    print(f"| … of which content (blobs, batches, file_content) | {kb(wo['content_bytes'])} | {kb(w['content_bytes'])} |")
    print(f"| … of which listings | {kb(wo['listing_bytes'])} | {kb(w['listing_bytes'])} |")
    print(f"| … of which per-node answers and manifests | {kb(wo.get('generation_bytes', 0))} | "
          f"{kb(w.get('generation_bytes', 0))} |")
    print(f"| per node | {kb(wo['per_node_bytes'])} | {kb(w['per_node_bytes'])} |")
    print(f"| wall time of the fleet's runs ({PARALLEL} at a time) | {wo['wall_s']:.1f} s | {w['wall_s']:.1f} s |")
    hits = w.get("nginx_blobs", {})
    print(f"| nginx: blob requests HIT / MISS | – | {hits.get('HIT', 0)} / {hits.get('MISS', 0)} |")
