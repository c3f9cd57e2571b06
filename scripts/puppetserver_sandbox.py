#!/usr/bin/env python3
"""A throwaway Puppet Server 7 (Debian's `puppetserver` package) in one directory.

Used by the end-to-end test tests/e2e/puppet_server.rs and by bench/run.py, so both start
Puppet Server the same way. Nothing outside DIR is written: its own puppet.conf, conf.d,
logback files, CA, ssldir, code and var directories; it binds 127.0.0.1 only; its access log
(DIR/log/access.log: client, request line, status, bytes, ms) is what tests count requests in.

  setup    --dir DIR --port PORT   write the configuration, create the CA (`puppetserver ca
                                   setup`) and the server certificate for `localhost`
  serve    --dir DIR               exec the JVM in the foreground (the caller kills it)
  wait     --dir DIR [--timeout S] wait until the server says it is ready (its restart file)
  generate --dir DIR --certname N [--san a,b]
                                   sign a certificate through the running server's CA API;
                                   files land in DIR/ssl (Puppet's ssldir layout)
  start    --dir DIR --port PORT   setup + serve in the background + wait; prints the PID

Options of setup (and start) for a server behind a TLS-terminating balancer
(docs/puppet-fleet.md#running-in-a-puppet-fleet; tests/e2e/puppet_fleet.rs):
  --http-port P       also listen on 127.0.0.1:P in plain HTTP (webserver `host`/`port`), the
                      balancer's backend; the HTTPS port stays
  --header-identity   `allow-header-cert-info: true` in auth.conf: the client's identity comes
                      from X-Client-Verify / X-Client-DN / X-Client-Cert only, on every port
                      (so certificates must be generated before the server runs: --certs)
  --certs A,B         certificates signed offline by the CA right after it is created
  --enc CERT=ENV      an ENC (`node_terminus = exec`, DIR/enc.sh) assigning ENV to CERT;
                      repeatable; other nodes get no environment from it
  --manifest ENV      code/environments/ENV/manifests/site.pp: one `file` resource at the path
                      in the agent's fact `fleet_target` (a plugin the test syncs provides it)
  --puppetdb URL      store facts in the PuppetDB at URL (https://...; Debian's
                      puppet-terminus-puppetdb): `storeconfigs`, conf/puppetdb.conf and a
                      routes.yaml sending the server's facts to PuppetDB (cached in yaml)

Code goes under DIR/code/environments/<env>/... (Puppet's environmentpath; an environment may
have its own environment.conf); basemodulepath is DIR/code/modules alone (not the packaged
default's second entry), so a pluginsync master given the same two directories serves the same.
stdlib only. JAVA_ARGS overrides the JVM flags (default -Xms256m -Xmx768m).
"""
import argparse, os, subprocess, sys, time

JAR = "/usr/share/puppetserver/puppetserver.jar"
BOOTSTRAP = "/etc/puppet/puppetserver/services.d"
PACKAGED_CONFD = "/etc/puppet/puppetserver/conf.d"
PUPPETDB_TERMINUS = "/usr/lib/ruby/vendor_ruby/puppet/indirector/facts/puppetdb.rb"


def installed():
    """True when Debian's puppetserver package (the jar and the CA tool) is present."""
    return os.path.isfile(JAR) and os.path.isfile("/usr/bin/puppetserver")


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def puppet_conf(d):
    return os.path.join(d, "conf", "puppet.conf")


def setup(d, port, http_port=None, header_identity=False, certs=(), enc=(), manifests=(), puppetdb=None):
    """Writes every configuration file and creates the CA. Idempotent for the CA."""
    d = os.path.abspath(d)
    for sub in ("conf", "code/environments", "code/modules", "var", "server-var", "log", "run", "ssl", "jruby-gems"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    write(puppet_conf(d), f"""[main]
server = localhost
serverport = {port}
certname = localhost
ssldir = {d}/ssl
vardir = {d}/var
codedir = {d}/code
basemodulepath = {d}/code/modules
logdir = {d}/log
rundir = {d}/run
[server]
cadir = {d}/ca
""" + (f"node_terminus = exec\nexternal_nodes = {d}/enc.sh\n" if enc else "")
      + ("storeconfigs = true\nstoreconfigs_backend = puppetdb\n" if puppetdb else ""))
    if puppetdb:
        write_puppetdb(d, puppetdb)
    if enc:
        write_enc(d, enc)
    for env in manifests:
        write(os.path.join(d, "code", "environments", env, "manifests", "site.pp"), SITE_PP)
    confd = os.path.join(d, "conf.d")
    os.makedirs(confd, exist_ok=True)
    # auth.conf, routes and metrics exactly as packaged: the default rules are part of what
    # a stock server is.
    for name in ("auth.conf", "web-routes.conf", "metrics.conf"):
        with open(os.path.join(PACKAGED_CONFD, name)) as f:
            text = f.read()
        if name == "auth.conf" and header_identity:
            # Puppet Server's external SSL termination: identity from the balancer's headers.
            text = text.replace("version: 1", "version: 1\n    allow-header-cert-info: true", 1)
            assert "allow-header-cert-info: true" in text, "auth.conf has no `version: 1`"
        write(os.path.join(confd, name), text)
    # The master's certificate for pluginsync is requested with subject alt names.
    write(os.path.join(confd, "ca.conf"), "certificate-authority: {\n    allow-subject-alt-names: true\n}\n")
    write(os.path.join(confd, "global.conf"), f"global: {{\n    logging-config: {d}/logback.xml\n}}\n")
    write(os.path.join(confd, "webserver.conf"), f"""webserver: {{
    access-log-config: {d}/request-logging.xml
    client-auth: want
    ssl-host: 127.0.0.1
    ssl-port: {port}
""" + (f"    host: 127.0.0.1\n    port: {http_port}\n" if http_port else "") + "}\n")
    write(os.path.join(confd, "puppetserver.conf"), f"""jruby-puppet: {{
    ruby-load-path: [/usr/lib/puppetserver/ruby/vendor_ruby]
    gem-home: {d}/jruby-gems
    gem-path: [${{jruby-puppet.gem-home}}, "/usr/lib/puppetserver/vendored-jruby-gems"]
    server-conf-dir: {d}/conf
    server-code-dir: {d}/code
    server-var-dir: {d}/server-var
    server-run-dir: {d}/run
    server-log-dir: {d}/log
    max-active-instances: 1
}}
http-client: {{}}
profiler: {{}}
""")
    write(os.path.join(d, "logback.xml"), f"""<configuration>
  <appender name="F" class="ch.qos.logback.core.FileAppender">
    <file>{d}/log/puppetserver.log</file>
    <encoder><pattern>%d %-5p [%c{{2}}] %m%n</pattern></encoder>
  </appender>
  <root level="info"><appender-ref ref="F"/></root>
</configuration>
""")
    write(os.path.join(d, "request-logging.xml"), f"""<configuration>
  <appender name="F" class="ch.qos.logback.core.FileAppender">
    <file>{d}/log/access.log</file>
    <encoder><pattern>%h "%r" %s %b %D</pattern></encoder>
  </appender>
  <appender-ref ref="F" />
</configuration>
""")
    if not os.path.isfile(os.path.join(d, "ca", "ca_crt.pem")):
        subprocess.run(["puppetserver", "ca", "setup", "--config", puppet_conf(d),
                        "--certname", "localhost", "--subject-alt-names", "localhost,127.0.0.1"],
                       check=True, stdout=subprocess.DEVNULL)
    missing = [c for c in certs if not os.path.isfile(os.path.join(d, "ssl", "certs", f"{c}.pem"))]
    if missing:
        # The server is not running: the CA tool signs offline only with --ca-client, which
        # also marks the certificates as CA clients (pp_cli_auth). A sandbox's agents may
        # carry that; with --header-identity the server never sees the certificates anyway.
        r = subprocess.run(["puppetserver", "ca", "generate", "--config", puppet_conf(d),
                            "--certname", ",".join(missing), "--ca-client"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"error: the CA did not sign {','.join(missing)} offline "
                             f"(exit {r.returncode}): {(r.stderr or r.stdout).strip()}")


# The catalog of --manifest: one file, at a path the agent's own fact names (so the agent's
# synced plugin is loaded in the very run that needs it).
SITE_PP = """node default {
  file { $facts['fleet_target']:
    ensure  => file,
    content => "applied from environment ${server_facts['environment']}\\n",
  }
}
"""


def write_puppetdb(d, url):
    """PuppetDB as the server's fact store, as PuppetDB's docs connect a Puppet Server."""
    if not os.path.isfile(PUPPETDB_TERMINUS):
        raise SystemExit("error: --puppetdb needs the PuppetDB terminus (apt-get install puppet-terminus-puppetdb)")
    write(os.path.join(d, "conf", "puppetdb.conf"), f"[main]\nserver_urls = {url}\nsoft_write_failure = false\n")
    write(os.path.join(d, "conf", "routes.yaml"),
          "---\nserver:\n  facts:\n    terminus: puppetdb\n    cache: yaml\n")


def write_enc(d, enc):
    """DIR/enc.sh: Puppet's exec node terminus; YAML naming the environment of listed nodes."""
    cases = "".join(f"  '{cert}') echo 'environment: {env}' ;;\n" for cert, env in enc)
    path = os.path.join(d, "enc.sh")
    write(path, f"#!/bin/sh\necho '---'\necho 'classes: {{}}'\ncase \"$1\" in\n{cases}esac\n")
    os.chmod(path, 0o755)


def java_cmd(d):
    d = os.path.abspath(d)
    args = os.environ.get("JAVA_ARGS", "-Xms256m -Xmx768m").split()
    return ["java", *args, "-Djruby.lib=/usr/share/jruby/lib", "-XX:+CrashOnOutOfMemoryError",
            "-jar", JAR, "--config", os.path.join(d, "conf.d"), "--bootstrap-config", BOOTSTRAP,
            "--restart-file", os.path.join(d, "run", "restart")]


def restart_file(d):
    return os.path.join(os.path.abspath(d), "run", "restart")


def serve(d):
    """Replaces this process with the JVM (so a caller's PID is the server's)."""
    with open(restart_file(d), "w") as f:
        f.write("0")
    cmd = java_cmd(d)
    os.execvp(cmd[0], cmd)


def wait(d, timeout, pid=None):
    """Waits until the restart file says 1 (Trapperkeeper writes it once every service is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(restart_file(d)) as f:
                if f.read(1) == "1":
                    return
        except FileNotFoundError:
            pass
        if pid is not None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                raise SystemExit(f"error: puppetserver exited while starting; see {d}/log/puppetserver.log")
        time.sleep(0.5)
    raise SystemExit(f"error: puppetserver not ready after {timeout} s; see {d}/log/puppetserver.log")


def generate(d, certname, sans=None):
    """Has the running server's CA sign a new certificate for certname (keys in DIR/ssl)."""
    cmd = ["puppetserver", "ca", "generate", "--config", puppet_conf(d), "--certname", certname]
    if sans:
        cmd += ["--subject-alt-names", sans]
    # Its output is kept for failures only: puppetserver 7 prints "Signed
    # certificate ... could not be found on the CA" even when it signs.
    r = subprocess.run(cmd, capture_output=True, text=True)
    cert = os.path.join(os.path.abspath(d), "ssl", "certs", f"{certname}.pem")
    if r.returncode != 0 or not os.path.isfile(cert):
        raise SystemExit(f"error: the CA did not sign {certname} (exit {r.returncode}): "
                         f"{(r.stderr or r.stdout).strip()}; see {d}/log/puppetserver.log")


def start(d, port, timeout=300, **options):
    """setup + the JVM in the background + wait; returns the Popen (its own process group)."""
    setup(d, port, **options)
    with open(restart_file(d), "w") as f:
        f.write("0")
    out = open(os.path.join(os.path.abspath(d), "log", "stdout.log"), "w")
    p = subprocess.Popen(java_cmd(d), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        wait(d, timeout, p.pid)
    except BaseException:
        p.kill()
        raise
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["setup", "serve", "wait", "generate", "start"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--port", type=int)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--certname")
    ap.add_argument("--san")
    ap.add_argument("--http-port", type=int)
    ap.add_argument("--header-identity", action="store_true")
    ap.add_argument("--certs", default="")
    ap.add_argument("--enc", action="append", default=[])
    ap.add_argument("--manifest", action="append", default=[])
    ap.add_argument("--puppetdb")
    a = ap.parse_args()
    enc = []
    for item in a.enc:
        cert, sep, env = item.partition("=")
        if not sep or not cert or not env:
            raise SystemExit(f"error: --enc wants CERTNAME=ENVIRONMENT, not {item!r}")
        enc.append((cert, env))
    options = dict(http_port=a.http_port, header_identity=a.header_identity,
                   certs=[c for c in a.certs.split(",") if c], enc=enc, manifests=a.manifest,
                   puppetdb=a.puppetdb)
    if not installed():
        raise SystemExit("error: puppetserver is not installed (apt-get install puppetserver)")
    if a.action in ("setup", "start") and not a.port:
        raise SystemExit(f"error: {a.action} needs --port")
    if a.action == "setup":
        setup(a.dir, a.port, **options)
    elif a.action == "serve":
        serve(a.dir)
    elif a.action == "wait":
        wait(a.dir, a.timeout)
    elif a.action == "generate":
        if not a.certname:
            raise SystemExit("error: generate needs --certname")
        generate(a.dir, a.certname, a.san)
    elif a.action == "start":
        print(start(a.dir, a.port, a.timeout, **options).pid, flush=True)


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as e:
        print(f"error: {' '.join(e.cmd[:3])} failed with exit code {e.returncode}", file=sys.stderr)
        sys.exit(1)
