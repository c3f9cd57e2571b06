//! The health loop on a real mixed fleet (docs/rollouts.md#the-health-gate,
//! docs/puppet-fleet.md#stock-agents-reports): one throwaway Puppet Server
//! 7 (`reports = store,http`, `reporturl` naming
//! `/pluginsync/v1/reports/puppet` through the balancer), two pluginsync
//! masters (one PostgreSQL state store, one rollout policy) behind HAProxy with
//! the shipped `packaging/haproxy-puppet.cfg` (or nginx with the shipped
//! `packaging/nginx-puppet.conf`, one scenario for both), 24 of our agents each
//! reading its own puppet.conf (certname, ssldir, `server_list`, `libdir`,
//! `pluginfactdest`; fact health on, as by default where Facter is) and 4
//! stock `puppet agent -t` nodes, every certname signed by the suite's
//! Puppet CA.
//!
//! G1 (a good custom and external fact) is promoted to everyone. G2 adds
//! the four facts Puppet fleets break on (a facts.d script exiting 3 with
//! stderr, one printing control bytes and no `=`, one sleeping 20 s, a
//! `lib/facter/*.rb` raising in `setcode`) in a 20 % first wave: the gate
//! halts within 60 s of the first wave's syncs, and only by counting both
//! kinds of node (its `min_nodes` is the whole first wave: our agents'
//! fact check and the stock node's run report); the inventory lists both
//! kinds failing on G2. `rollout status`, `pluginsync-master inventory
//! --format json` and both masters' `/metrics` agree on nodes and failing
//! nodes per generation. After `rollout rollback` the first wave is back
//! on G1 (byte for byte and mode for mode), and every other node changes
//! nothing: our agents report 0 changes, stock agents exit 0 with their
//! libdir and pluginfactdest trees as before.
//!
//! Through nginx the scenario runs to the halt and the agreement (the
//! half that proves the loop closes through that balancer: generations
//! reach our agents, both kinds of failure reach the gate); the rollback
//! half, which no balancer changes, runs through HAProxy only, to keep
//! CI's wall time (each half's time is printed).
//!
//! SKIPPED with a message where `puppet`, `puppetserver`, the balancer,
//! `facter` or PostgreSQL is missing, except under CI. One JVM per test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pluginsync_common::rollout::{in_share, position};
use pluginsync_tests::balancer::{Backends, Balancer, ProxyBackend, wait_served};
use pluginsync_tests::puppet::{PuppetAgent, PuppetServer};
use pluginsync_tests::{bin_path, closed_port, require, tree_snapshot};
use serde_json::Value;

use crate::puppet_fleet::node_ssldir;

const TEST: &str = "puppet_mixed_fleet";
/// The first wave's share.
const FIRST: f64 = 20.0;
/// Our agents in the first wave, and outside it.
const OURS: (usize, usize) = (5, 19);
/// Stock agents in the first wave, and outside it.
const STOCK: (usize, usize) = (1, 3);
/// Agents run at once (the CI machine has 2 cores).
const WIDTH: usize = 6;

/// G2's broken facts: (path under the module, text, mode).
const BAD: [(&str, &str, u32); 4] = [
    (
        "facts.d/bad_exit.sh",
        "#!/bin/sh\necho 'bad_exit cannot read its source' >&2\nexit 3\n",
        0o755,
    ),
    (
        "facts.d/garbage.sh",
        "#!/bin/sh\nprintf 'no\\001equals\\033[31m sign\\n'\n",
        0o755,
    ),
    (
        "facts.d/slow.sh",
        "#!/bin/sh\nsleep 20\necho slow=1\n",
        0o755,
    ),
    (
        "lib/facter/raises.rb",
        "Facter.add(:raises) { setcode { raise 'raised in setcode' } }\n",
        0o644,
    ),
];

/// The plugins our agents' fact check names for [`BAD`].
const OURS_FAILING: [&str; 4] = [
    "pluginfacts/bad_exit.sh",
    "pluginfacts/garbage.sh",
    "pluginfacts/slow.sh",
    "plugins/facter/raises.rb",
];

/// The balancer in front of the fleet, from its shipped file.
#[derive(Clone, Copy, PartialEq)]
enum Lb {
    /// HAProxy with `packaging/haproxy-puppet.cfg`.
    Haproxy,
    /// nginx with `packaging/nginx-puppet.conf`.
    Nginx,
}

impl Lb {
    /// Its program's name (and Debian package's).
    fn program(self) -> &'static str {
        match self {
            Lb::Haproxy => "haproxy",
            Lb::Nginx => "nginx",
        }
    }

    /// The test's name in SKIPPED and timing lines.
    fn test(self) -> &'static str {
        match self {
            Lb::Haproxy => TEST,
            Lb::Nginx => "puppet_mixed_fleet_nginx",
        }
    }

    /// `program` started with its shipped file in front of `backends`.
    fn spawn(self, program: &Path, backends: &Backends) -> Balancer {
        match self {
            Lb::Haproxy => Balancer::haproxy(program, backends),
            Lb::Nginx => Balancer::nginx(program, backends),
        }
    }
}

fn policy() -> String {
    let whole_wave = OURS.0 + STOCK.0;
    format!(
        "[[rollout]]\nenvironments = [\"production\"]\n\
         waves = [ {{ after = \"0s\", percent = {FIRST} }}, {{ after = \"1h\", percent = 100 }} ]\n\
         halt_on_load_failures = {{ percent = 50, min_nodes = {whole_wave} }}\n"
    )
}

/// `(in, out)` certnames `prefix{n}` placed in the first wave and outside it.
fn names(prefix: &str, (want_in, want_out): (usize, usize)) -> Vec<String> {
    let (mut i, mut o) = (Vec::new(), Vec::new());
    for n in 0.. {
        let name = format!("{prefix}{n:03}");
        match in_share(position("production", &name), FIRST) {
            true if i.len() < want_in => i.push(name),
            false if o.len() < want_out => o.push(name),
            _ => {}
        }
        if i.len() == want_in && o.len() == want_out {
            break;
        }
    }
    i.into_iter().chain(o).collect()
}

fn put(envpath: &Path, rel: &str, text: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let path = envpath.join("production/modules/health").join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `f` over `items`, at most [`WIDTH`] at once, results in order.
fn parallel<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let mut out: Vec<(usize, R)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..WIDTH.min(items.len()))
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(item) = items.get(i) else {
                            return done;
                        };
                        done.push((i, f(item)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker"))
            .collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// One of our agents: its home, agent.toml naming only its vardir and
/// puppet.conf, which names everything else.
struct Node {
    certname: String,
    dir: tempfile::TempDir,
}

impl Node {
    fn new(certname: &str, ssldir: &Path, lb_port: u16) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().display();
        let conf = dir.path().join("puppet.conf");
        std::fs::write(
            &conf,
            format!(
                "[main]\nssldir = {ssldir}\nserver_list = localhost:{lb_port}\n\
                 logdir = {home}/plog\nrundir = {home}/prun\nlibdir = {home}/plib\n\n\
                 [agent]\ncertname = {certname}\npluginfactdest = {home}/pfacts\n",
                ssldir = ssldir.display(),
            ),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("agent.toml"),
            // Each fact file's deadline: 18 s, above what a good fact takes
            // with 24 agents' Facter runs sharing 2 cores, below the 20 s
            // of the hanging fact, which must still fail.
            format!("vardir = \"var\"\npuppet_conf = {conf:?}\n\n[facts]\ntimeout = \"18s\"\n"),
        )
        .unwrap();
        Node {
            certname: certname.to_owned(),
            dir,
        }
    }

    /// `pluginsync-agent sync --format json`: its report (panics unless
    /// the run exits 0).
    fn sync(&self) -> Value {
        let out = Command::new(bin_path("pluginsync-agent"))
            .args(["sync", "--format", "json", "--config"])
            .arg(self.dir.path().join("agent.toml"))
            .env_remove("RUST_LOG")
            .output()
            .expect("run pluginsync-agent");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {stdout}\n{}",
            self.certname,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(&stdout).expect("the run's JSON report")
    }

    /// Both destinations, byte for byte and mode for mode.
    fn trees(&self) -> [BTreeMap<String, String>; 2] {
        ["plib", "pfacts"].map(|d| tree_snapshot(&self.dir.path().join(d)))
    }
}

fn stock_trees(agent: &PuppetAgent) -> [BTreeMap<String, String>; 2] {
    [
        tree_snapshot(&agent.libdir()),
        tree_snapshot(&agent.factsdir()),
    ]
}

/// The fleet's masters, their balancer and how to ask them.
struct Masters {
    backends: Vec<ProxyBackend>,
    metrics: Vec<u16>,
    cli: PathBuf,
    lb: Balancer,
}

impl Masters {
    /// Two replicas on `envpath` sharing the PostgreSQL database at `state`
    /// (docs/rollouts.md#replicas), behind `lb` (the program `program`)
    /// with its shipped config; `cli` a config with the masters' identity.
    fn start(
        lb: Lb,
        program: &Path,
        envpath: &Path,
        (http_port, state): (&str, &str),
    ) -> (Masters, u16) {
        let root = envpath.parent().unwrap().parent().unwrap();
        let ssl = root.join("ssl");
        let (cert, key) = (
            ssl.join("certs/localhost.pem"),
            ssl.join("private_keys/localhost.pem"),
        );
        let (ca, crl) = (ssl.join("certs/ca.pem"), ssl.join("crl.pem"));
        let base = envpath.parent().unwrap().join("modules");
        let ports = [closed_port(), closed_port()];
        let metrics = vec![closed_port(), closed_port()];
        let backends: Vec<ProxyBackend> = (0..2)
            .map(|i| {
                let extra = format!(
                    "[state]\nurl = {state:?}\n\
                     [metrics]\nlisten = \"127.0.0.1:{}\"\n\
                     [reports]\npuppetserver_certnames = [\"localhost\"]\n{}",
                    metrics[i],
                    policy()
                );
                let tls = [&cert, &key, &ca, &crl].map(PathBuf::as_path);
                ProxyBackend::spawn_on(envpath, &base, tls, ports[i], &extra)
            })
            .collect();
        let lb = lb.spawn(
            program,
            &Backends {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
                crl: crl.clone(),
                puppetserver: format!("127.0.0.1:{http_port}"),
                pluginsync: backends.iter().map(|m| m.proxy.clone()).collect(),
            },
        );
        let cli = root.join("pluginsync-cli.toml");
        std::fs::write(
            &cli,
            format!(
                "listen = [\"127.0.0.1:{}\"]\nenvironmentpath = [{envpath:?}]\n\
                 [tls]\ncert = {cert:?}\nkey = {key:?}\nca = {ca:?}\ncrl = {crl:?}\n",
                ports[0]
            ),
        )
        .unwrap();
        let port = lb.port;
        let masters = Masters {
            backends,
            metrics,
            cli,
            lb,
        };
        (masters, port)
    }

    /// `pluginsync-master COMMAND --config CLI --master A --master B ARGS`
    /// (or only A, `both` false): stdout, panicking unless it exits 0.
    fn command(&self, command: &str, both: bool, args: &[&str]) -> String {
        let mut cmd = Command::new(bin_path("pluginsync-master"));
        cmd.args([command, "--config"]).arg(&self.cli);
        for m in &self.backends[..if both { 2 } else { 1 }] {
            cmd.args(["--master", &m.tls_url()]);
        }
        let out = cmd.args(args).output().expect("run pluginsync-master");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{command} {args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }

    /// `rollout ACTION production --format json` on both: their statuses.
    fn rollout(&self, action: &str) -> Vec<Value> {
        let text = self.command("rollout", true, &["--format", "json", action, "production"]);
        let list: Vec<Value> = serde_json::from_str(&text).expect("JSON");
        list.into_iter().map(|v| v["status"].clone()).collect()
    }

    /// Waits (at most 90 s) until both keep `n` generations: the newest id.
    fn generations(&self, n: usize) -> String {
        let end = Instant::now() + Duration::from_secs(90);
        loop {
            let s = self.rollout("status");
            if s.iter()
                .all(|s| s["generations"].as_array().map(Vec::len) == Some(n))
            {
                return s[0]["generations"][0]["id"].as_str().unwrap().to_owned();
            }
            assert!(Instant::now() < end, "{n} generations on both: {s:?}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `inventory production --format json` of the first master.
    fn inventory(&self) -> Vec<Value> {
        let text = self.command("inventory", false, &["production", "--format", "json"]);
        serde_json::from_str(&text).expect("inventory JSON")
    }

    /// Master `i`'s `GET /metrics`.
    fn metrics(&self, i: usize) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics[i])).expect("metrics");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    }
}

/// Per generation: (nodes, failing nodes), as `rollout status`, the
/// inventory and each master's metrics say; all four must agree within
/// 10 s (what one master heard is in the shared store within the
/// writer's 200 ms, in the other's counts within their 1 s refresh,
/// docs/rollouts.md#replicas).
fn agree(masters: &Masters, gens: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match disagreement(masters, gens) {
            None => return,
            Some(why) if Instant::now() >= deadline => panic!("{why}"),
            Some(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// What [`agree`] finds different, if anything.
fn disagreement(masters: &Masters, gens: &[&str]) -> Option<String> {
    let status = masters.rollout("status");
    let inventory = masters.inventory();
    for id in gens {
        let from_status: Vec<(u64, u64)> = status
            .iter()
            .map(|s| {
                let g = (s["generations"].as_array().unwrap().iter())
                    .find(|g| g["id"] == *id)
                    .unwrap_or_else(|| panic!("{id} in {s}"));
                (
                    g["nodes"].as_u64().unwrap(),
                    g["failing_nodes"].as_u64().unwrap(),
                )
            })
            .collect();
        let on: Vec<&Value> = (inventory.iter())
            .filter(|n| {
                n["generation"]
                    .as_str()
                    .is_some_and(|g| id.starts_with(g) || g.starts_with(id))
            })
            .collect();
        let failing = (on.iter())
            .filter(|n| {
                n["failing_plugins"]
                    .as_array()
                    .is_some_and(|a| !a.is_empty())
            })
            .count() as u64;
        let from_inventory = (on.len() as u64, failing);
        let from_metrics: Vec<(u64, u64)> = (0..2)
            .map(|i| {
                let text = masters.metrics(i);
                let series = |name: &str| {
                    text.lines()
                        .filter(|l| l.starts_with(&format!("{name}{{")))
                        .find(|l| {
                            l.split("generation=\"").nth(1).is_some_and(|rest| {
                                let g = rest.split('"').next().unwrap_or_default();
                                !g.is_empty() && id.starts_with(g)
                            })
                        })
                        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                        .unwrap_or(0.0) as u64
                };
                (
                    series("pluginsync_fleet_nodes"),
                    series("pluginsync_fleet_load_failures"),
                )
            })
            .collect();
        if !from_status.iter().all(|s| *s == from_inventory) {
            return Some(format!(
                "{id}: status {from_status:?}, inventory {from_inventory:?}\n{status:?}\n{inventory:?}"
            ));
        }
        if !from_metrics.iter().all(|m| *m == from_inventory) {
            return Some(format!(
                "{id}: metrics {from_metrics:?}, inventory {from_inventory:?}"
            ));
        }
    }
    None
}

/// True when inventory `entry` names generation `id` (full or short).
fn on(entry: &Value, id: &str) -> bool {
    entry["generation"]
        .as_str()
        .is_some_and(|g| !g.is_empty() && (id.starts_with(g) || g.starts_with(id)))
}

fn failing(entry: &Value) -> Vec<String> {
    let mut names: Vec<String> = (entry["failing_plugins"].as_array().into_iter().flatten())
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

/// The fleet as the test drives it.
struct Fleet {
    lb: Lb,
    masters: Masters,
    nodes: Vec<Node>,
    stock: Vec<PuppetAgent>,
}

impl Fleet {
    /// One run of every node, ours and stock at once: our reports, the
    /// stock runs' exit codes and output.
    fn round(&self) -> (Vec<Value>, Vec<(i32, String)>) {
        std::thread::scope(|s| {
            let stock = s.spawn(|| {
                parallel(&self.stock, |a| {
                    let run = a.agent_test_reporting("production");
                    (run.code, run.output)
                })
            });
            let ours = parallel(&self.nodes, Node::sync);
            (ours, stock.join().expect("stock agents"))
        })
    }

    /// Whether our node `i` / stock node `i` is in the first wave.
    fn ours_in(i: usize) -> bool {
        i < OURS.0
    }
    fn stock_in(i: usize) -> bool {
        i < STOCK.0
    }
}

/// G2 in its first wave: the wave takes it, nobody else moves; the gate
/// halts within 60 s of the wave's syncs, counting our agents' fact check
/// and the stock node's report; both kinds fail on G2 in the inventory.
fn first_wave_halts(fleet: &Fleet, g1: &str, g2: &str) {
    let (ours, stock) = fleet.round();
    let synced = Instant::now();
    for (i, r) in ours.iter().enumerate() {
        let want = if Fleet::ours_in(i) { g2 } else { g1 };
        assert_eq!(r["generation"], want, "{}: {r}", fleet.nodes[i].certname);
        if !Fleet::ours_in(i) {
            assert_eq!(r["changes"], serde_json::json!([]), "{r}");
        }
    }
    assert!(
        stock[0].1.contains("fact='raises'"),
        "the first-wave stock node did not load G2:\n{}",
        stock[0].1
    );
    // Reports are current (each run reports after its fact check, a
    // stock run through Puppet Server's report processor): no node runs
    // again, the gate must see the whole wave failing as it is. Both
    // masters' status twice a second; what each counted on G2 is said
    // (each change of it) if no halt comes.
    let mut seen: Vec<String> = Vec::new();
    let mut last = String::new();
    let halted = loop {
        let status = fleet.masters.rollout("status");
        if status.iter().all(|s| s["halted"] == true) {
            break status;
        }
        let counts: Vec<String> = (status.iter())
            .map(|s| {
                let g = &s["generations"][0];
                format!("{}/{}", g["failing_nodes"], g["nodes"])
            })
            .collect();
        let counts = counts.join(" ");
        if counts != last {
            seen.push(format!("{:.1}s {counts}", synced.elapsed().as_secs_f64()));
            last = counts;
        }
        assert!(
            synced.elapsed() < Duration::from_secs(60),
            "no halt within 60 s of the first wave's syncs (failing/nodes on G2 per \
             master as they changed: {seen:?}): {status:?}\n{}",
            fleet.masters.backends[0].log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!(
        "{}: halted {:?} after the first wave's syncs (failing/nodes on G2 before: {seen:?})",
        fleet.lb.test(),
        synced.elapsed()
    );
    let whole_wave = OURS.0 + STOCK.0;
    assert!(
        halted.iter().all(|s| s["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("{whole_wave} of {whole_wave} nodes")))),
        "{halted:?}"
    );

    let inventory = fleet.masters.inventory();
    let entry = |certname: &str| {
        (inventory.iter())
            .find(|n| n["certname"] == certname)
            .unwrap_or_else(|| panic!("{certname} not in the inventory: {inventory:?}"))
    };
    for (i, node) in fleet.nodes.iter().enumerate() {
        let e = entry(&node.certname);
        if Fleet::ours_in(i) {
            let f = failing(e);
            assert!(
                on(e, g2) && OURS_FAILING.iter().all(|p| f.contains(&(*p).to_owned())),
                "{e}\n{}",
                ours[i]["loads"]
            );
            // A file G2 did not break failing too is load, not the file:
            // shown with the agent's own reason.
            let extra: Vec<&String> = (f.iter())
                .filter(|p| !OURS_FAILING.contains(&p.as_str()))
                .collect();
            if !extra.is_empty() {
                eprintln!(
                    "{}: {} also failed {extra:?}: {}",
                    fleet.lb.test(),
                    node.certname,
                    ours[i]["loads"]
                );
            }
        } else {
            assert!(on(e, g1) && failing(e).is_empty(), "{e}");
        }
    }
    for (i, agent) in fleet.stock.iter().enumerate() {
        let e = entry(agent.certname());
        if Fleet::stock_in(i) {
            let f = failing(e);
            assert!(
                on(e, g2)
                    && f.contains(&"plugins/facter/raises.rb".to_owned())
                    && f.contains(&"pluginfacts/bad_exit.sh".to_owned()),
                "{e}\n{}",
                stock[i].1
            );
        } else {
            assert!(on(e, g1) && failing(e).is_empty(), "{e}");
        }
    }
    agree(&fleet.masters, &[g1, g2]);
}

/// `rollout rollback`: the first wave back on G1 as it was, byte for byte
/// and mode for mode; every other node changes nothing.
fn rollback_moves_only_the_first_wave(
    fleet: &Fleet,
    g1: &str,
    before: &[[BTreeMap<String, String>; 2]],
    stock_before: &[[BTreeMap<String, String>; 2]],
) {
    // Sent to one master: on one database a command sent to both is
    // applied twice, and a second rollback withdraws the next generation
    // (docs/rollouts.md#replicas). The other takes it within 2 s.
    fleet
        .masters
        .command("rollout", false, &["rollback", "production"]);
    let end = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let s = fleet.masters.rollout("status");
        if s.iter().all(|s| s["generations"][0]["withdrawn"] == true) {
            break s;
        }
        assert!(Instant::now() < end, "the rollback reaches both: {s:?}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(status.iter().all(|s| s["halted"] == false), "{status:?}");
    let (ours, stock) = fleet.round();
    for (i, r) in ours.iter().enumerate() {
        let who = &fleet.nodes[i].certname;
        assert_eq!(r["generation"], g1, "{who}: {r}");
        if !Fleet::ours_in(i) {
            assert_eq!(r["changes"], serde_json::json!([]), "{who}: {r}");
        }
        assert!(fleet.nodes[i].trees() == before[i], "{who}: not G1's trees");
    }
    for (i, (code, output)) in stock.iter().enumerate() {
        let who = fleet.stock[i].certname();
        if !Fleet::stock_in(i) {
            assert_eq!(*code, 0, "{who}:\n{output}");
        }
        assert!(
            stock_trees(&fleet.stock[i]) == stock_before[i],
            "{who}: its libdir or pluginfactdest is not G1's:\n{output}"
        );
    }
}

/// Puppet Server with the masters and the balancer started between its
/// setup and its JVM (which reads `reporturl` once), G1 in the tree; the
/// masters' state in the PostgreSQL database at `state`.
fn start(lb: Lb, program: &Path, certs: &str, state: &str) -> (PuppetServer, Masters, u16) {
    let http_port = closed_port().to_string();
    let mut held: Option<(Masters, u16)> = None;
    let server = PuppetServer::start_with(
        &[
            "--http-port",
            &http_port,
            "--header-identity",
            "--certs",
            certs,
        ],
        |envpath| {
            put(
                envpath,
                "lib/facter/good.rb",
                "Facter.add(:good) { setcode { 'fine' } }\n",
                0o644,
            );
            put(envpath, "facts.d/good.txt", "good_ext=1\n", 0o644);
            let (masters, port) = Masters::start(lb, program, envpath, (http_port.as_str(), state));
            let conf = envpath
                .parent()
                .unwrap()
                .parent()
                .unwrap()
                .join("conf/puppet.conf");
            let mut text = std::fs::read_to_string(&conf).unwrap();
            // Appended to the file's last section, [server].
            assert!(text.contains("[server]"), "{text}");
            text.push_str(&format!(
                "reports = store,http\nreporturl = https://localhost:{port}/pluginsync/v1/reports/puppet\n"
            ));
            std::fs::write(&conf, text).unwrap();
            held = Some((masters, port));
        },
    );
    let (masters, port) = held.expect("masters and balancer");
    masters.lb.wait_puppetserver(&server.ssldir());
    (server, masters, port)
}

#[test]
fn a_broken_fact_halts_the_first_wave_and_its_rollback_moves_no_other_node() {
    scenario(Lb::Haproxy, true);
}

#[test]
fn through_nginx_a_broken_fact_halts_the_first_wave() {
    scenario(Lb::Nginx, false);
}

/// The scenario through `lb`: G1 to everyone, G2's first wave halts and
/// the masters agree; with `rollback`, the rollback half too.
fn scenario(lb: Lb, rollback: bool) {
    let test = lb.test();
    let Some(puppet) = require("puppet", "puppet", test) else {
        return;
    };
    if !PuppetServer::required(test) {
        return;
    }
    let Some(program) = require(lb.program(), lb.program(), test) else {
        return;
    };
    if require("facter", "facter", test).is_none() {
        return;
    }
    let Some(pg) = pluginsync_tests::Postgres::launch(test) else {
        return;
    };
    let started = Instant::now();
    let (ours, stock) = (names("agent", OURS), names("stock", STOCK));
    let certs: Vec<&str> = ours.iter().chain(&stock).map(String::as_str).collect();
    let (server, masters, port) = start(lb, &program, &certs.join(","), &pg.database());
    let ssl = server.ssldir();
    let work = tempfile::tempdir().unwrap();
    let fleet = Fleet {
        lb,
        masters,
        nodes: ours.iter().map(|c| Node::new(c, &ssl, port)).collect(),
        stock: (stock.iter())
            .map(|c| {
                let dir = work.path().join(c);
                let node_ssl = node_ssldir(&server, &dir, c);
                PuppetAgent::new(&puppet, &dir, &node_ssl, c, port)
            })
            .collect(),
    };

    // G1 everyone's.
    let g1 = fleet.masters.generations(1);
    fleet.masters.rollout("promote");
    let (reports, runs) = fleet.round();
    for r in &reports {
        assert_eq!(r["generation"], g1.as_str(), "{r}");
    }
    for (code, output) in &runs {
        assert!(matches!(code, 0 | 2), "{output}");
    }
    let before: Vec<_> = fleet.nodes.iter().map(Node::trees).collect();
    let stock_before: Vec<_> = fleet.stock.iter().map(stock_trees).collect();
    assert!(
        before.iter().all(|t| t[0].contains_key("facter/good.rb")),
        "{before:?}"
    );

    // G2, the broken facts, in a 20 % first wave.
    // One rename brings all four (a module moved in whole), so the masters
    // make one generation of them.
    let envpath = server.envpath();
    let staging = envpath.parent().unwrap().join("staging");
    for (rel, text, mode) in BAD {
        put(&staging, rel, text, mode);
    }
    std::fs::rename(
        staging.join("production/modules/health"),
        envpath.join("production/modules/broken"),
    )
    .unwrap();
    let g2 = fleet.masters.generations(2);
    wait_served(
        &fleet.masters.backends,
        &stock[0],
        "pluginfacts",
        "slow.sh",
        BAD[2].1,
    );
    first_wave_halts(&fleet, &g1, &g2);
    eprintln!("{test}: to the halt {:?}", started.elapsed());
    if rollback {
        let from = Instant::now();
        rollback_moves_only_the_first_wave(&fleet, &g1, &before, &stock_before);
        eprintln!("{test}: the rollback half {:?}", from.elapsed());
    }
    eprintln!("{test}: wall time {:?}", started.elapsed());
}
