//! `describe` loaders in the four plugin systems' layouts
//! (docs/loading.md#plugin-layouts), with real child processes. For each of
//! Packer, Terraform, Celerity and kustomize: several versions of one plugin
//! (the highest within the constraint active; Packer's `-dev` loses to its
//! release), a plugin whose path and `describe` answer disagree, a
//! non-executable one, one built for another os/arch (skipped where the
//! name says so and the system never looks there; failed at its launch
//! where nothing in the path says so), and two roots holding one identity
//! (the first root's wins). Terraform: a local build in `host_dir` over
//! every release. Celerity: an ID with a registry host, an ID both a
//! provider and a transformer (both failed), a plugin that fails its first
//! launches and answers within `attempts`, one that never answers (killed
//! with its children at each deadline, failed, the rest loaded).

use std::collections::BTreeMap;

use pluginsync_agent::plugins::{host_arch, host_os};
use pluginsync_tests::{AgentHome, AgentRun, EnvTree, Pki, TestMaster, config_toml, parse_config};

/// A plugin answering `describe` with `version` and `api`.
fn describe_script(version: &str, api: &str) -> String {
    format!(
        "#!/bin/sh\n[ \"$1\" = describe ] || exit 64\necho '{{\"version\":\"{version}\",\"api_version\":\"{api}\"}}'\n"
    )
}

fn loads(report: &serde_json::Value) -> std::collections::BTreeMap<String, (String, String)> {
    report["loads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["path"].as_str().unwrap().to_owned(),
                (
                    l["status"].as_str().unwrap().to_owned(),
                    l["error"].as_str().unwrap_or("").to_owned(),
                ),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_layout() {
    let host = format!("{}_{}", host_os(), host_arch());
    let other = if host_os() == "windows" {
        "linux_amd64"
    } else {
        "windows_amd64"
    };
    let tree = EnvTree::new();
    let put = |rel: String, script: String, mode: u32| {
        tree.file(
            "production",
            "alpha",
            &format!("lib/tf/{rel}"),
            script,
            mode,
        );
    };
    for v in ["2.0.0", "2.1.0", "3.0.0"] {
        put(
            format!("site/{host}/terraform-provider-aws_v{v}_x5"),
            describe_script(v, "5"),
            0o755,
        );
    }
    put(
        format!("site/{host}/terraform-provider-liar_v1.0.0"),
        describe_script("1.0.1", "5"),
        0o755,
    );
    put(
        format!("site/{host}/terraform-provider-noexec_v1.0.0"),
        describe_script("1.0.0", "5"),
        0o644,
    );
    put(
        format!("site/{other}/terraform-provider-aws_v9.0.0"),
        describe_script("9.0.0", "5"),
        0o755,
    );
    // `base` sorts (and loads) before `site`, but `site` is the first root.
    put(
        format!("base/{host}/terraform-provider-aws_v2.2.0_x5"),
        describe_script("2.2.0", "5"),
        0o755,
    );
    put(
        format!("base/{host}/terraform-provider-google_v1.0.0"),
        describe_script("1.0.0", "5"),
        0o755,
    );
    put(
        format!("site/{host}/terraform-provider-google_v0.9.0"),
        describe_script("0.9.0", "5"),
        0o755,
    );
    // A local build beside the host program, and a newer release.
    put(
        "site/bin/terraform-provider-tmpl".into(),
        describe_script("0.1.0", "5"),
        0o755,
    );
    put(
        format!("site/{host}/terraform-provider-tmpl_v1.5.0"),
        describe_script("1.5.0", "5"),
        0o755,
    );
    let pki = Pki::new();
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let config = r#"
[load]
enabled = true

[load.constraints]
aws = "~> 2.0"

[[loader]]
name = "terraform"
match = "tf/**"
kind = "describe"
layout = "terraform"
roots = ["tf/site", "tf/base"]
host_dir = "tf/site/bin"
"#;
    let home = AgentHome::new(&pki, &[master.url()], config);
    let run = home.sync(&["--format", "json"]);
    assert_eq!(run.code, 0, "load failures do not fail the sync: {run:?}");
    let report: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    let l = loads(&report);
    let status = |p: String| {
        l.get(&format!("plugins/tf/{p}"))
            .unwrap_or_else(|| panic!("{p} not in {l:#?}"))
            .clone()
    };
    for v in ["2.0.0", "2.1.0", "3.0.0"] {
        assert_eq!(
            status(format!("site/{host}/terraform-provider-aws_v{v}_x5")).0,
            "ok"
        );
    }
    let liar = status(format!("site/{host}/terraform-provider-liar_v1.0.0"));
    assert_eq!(liar.0, "failed");
    assert!(
        liar.1
            .contains("describe says version 1.0.1 but the name says 1.0.0"),
        "{}",
        liar.1
    );
    let noexec = status(format!("site/{host}/terraform-provider-noexec_v1.0.0"));
    assert_eq!(noexec.0, "failed");
    assert!(noexec.1.contains("not executable"), "{}", noexec.1);
    let foreign = status(format!("site/{other}/terraform-provider-aws_v9.0.0"));
    assert_eq!(foreign.0, "skipped");
    assert!(foreign.1.contains("this host is"), "{}", foreign.1);
    assert_eq!(
        status(format!("base/{host}/terraform-provider-google_v1.0.0")).0,
        "ok",
        "loaded before the first root's copy was seen"
    );
    assert_eq!(status("site/bin/terraform-provider-tmpl".into()).0, "ok");

    let plugins = home.run(&["plugins"]);
    assert_eq!(plugins.code, 0);
    let rows = |name: &str| -> Vec<String> {
        plugins
            .stdout
            .lines()
            .filter(|l| l.starts_with(&format!("{name} ")))
            .map(str::to_owned)
            .collect()
    };
    let active = |name: &str| -> String {
        let a: Vec<String> = rows(name)
            .into_iter()
            .filter(|l| l.contains(" active "))
            .collect();
        assert_eq!(a.len(), 1, "{}", plugins.stdout);
        a[0].clone()
    };
    assert!(
        active("aws").contains("2.1.0 ") && active("aws").contains("/tf/site/"),
        "highest within ~> 2.0 of the first root: {}",
        plugins.stdout
    );
    assert!(
        rows("aws").iter().all(|l| !l.contains("/tf/base/")),
        "the later root's aws dropped: {}",
        plugins.stdout
    );
    assert!(
        active("google").contains("0.9.0 ") && rows("google").len() == 1,
        "the first root wins over a higher version in a later one: {}",
        plugins.stdout
    );
    assert!(
        active("tmpl").contains("site/bin/terraform-provider-tmpl"),
        "the local build wins over the 1.5.0 release: {}",
        plugins.stdout
    );
    assert_eq!(rows("tmpl").len(), 2, "{}", plugins.stdout);
    assert!(rows("liar").is_empty() && rows("noexec").is_empty());
}

/// A plugin answering `describe` with `version`, `api` and, if given, `id`.
fn describe_with_id(version: &str, api: &str, id: &str) -> String {
    format!(
        "#!/bin/sh\n[ \"$1\" = describe ] || exit 64\necho '{{\"version\":\"{version}\",\"api_version\":\"{api}\",\"id\":\"{id}\"}}'\n"
    )
}

/// The first bytes of an ELF executable for an architecture this host
/// cannot run (aarch64 on x86_64, x86_64 elsewhere): exec fails with
/// "Exec format error", as a plugin built for another host does.
fn foreign_elf() -> Vec<u8> {
    let machine: u16 = if std::env::consts::ARCH == "x86_64" {
        183
    } else {
        62
    };
    let mut h = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
    h.extend_from_slice(&[0; 8]);
    h.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    h.extend_from_slice(&machine.to_le_bytes());
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&0x40_0000u64.to_le_bytes()); // entry
    h.extend_from_slice(&64u64.to_le_bytes()); // phoff
    h.extend_from_slice(&0u64.to_le_bytes()); // shoff
    h.extend_from_slice(&0u32.to_le_bytes()); // flags
    for v in [64u16, 56, 0, 64, 0, 0] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    h
}

/// The `plugins` table's rows: identity → (version, status, path) per row.
fn table(run: &AgentRun) -> BTreeMap<String, Vec<(String, String, String)>> {
    let mut rows: BTreeMap<String, Vec<(String, String, String)>> = BTreeMap::new();
    for line in run.stdout.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols.len(), 5, "{line}");
        rows.entry(cols[0].to_owned()).or_default().push((
            cols[1].to_owned(),
            cols[3].to_owned(),
            cols[4].to_owned(),
        ));
    }
    rows
}

/// The one active row of `id`: (version, path).
fn active(rows: &BTreeMap<String, Vec<(String, String, String)>>, id: &str) -> (String, String) {
    let a: Vec<_> = rows
        .get(id)
        .unwrap_or_else(|| panic!("{id} not in {rows:#?}"))
        .iter()
        .filter(|r| r.1 == "active")
        .collect();
    assert_eq!(a.len(), 1, "{id}: {rows:#?}");
    (a[0].0.clone(), a[0].2.clone())
}

/// Syncs `tree` with `config` and returns the loads and the `plugins` table.
#[allow(clippy::type_complexity)]
fn sync_and_list(
    tree: &EnvTree,
    config: &str,
) -> (
    AgentHome,
    BTreeMap<String, (String, String)>,
    BTreeMap<String, Vec<(String, String, String)>>,
) {
    let pki = Pki::new();
    let master = TestMaster::start(parse_config(&config_toml(&tree.envpath(), &pki, "", "")));
    let home = AgentHome::new(&pki, &[master.url()], config);
    let run = home.sync(&["--format", "json"]);
    assert_eq!(run.code, 0, "load failures do not fail the sync: {run:?}");
    let report: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    let plugins = home.run(&["plugins"]);
    assert_eq!(plugins.code, 0, "{plugins:?}");
    (home, loads(&report), table(&plugins))
}

fn expect(l: &BTreeMap<String, (String, String)>, path: &str, status: &str, why: &str) {
    let (s, e) = l
        .get(path)
        .unwrap_or_else(|| panic!("{path} not in {l:#?}"));
    assert_eq!(s, status, "{path}: {e}");
    assert!(e.contains(why), "{path}: '{e}' does not say '{why}'");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packer_layout() {
    let (os, arch) = (host_os(), host_arch());
    let other = if os == "linux" { "darwin" } else { "linux" };
    let name = |n: &str, v: &str| format!("pluginsync-plugin-{n}_v{v}_x1.0_{os}_{arch}");
    let tree = EnvTree::new();
    let put = |rel: String, script: String, mode: u32| {
        tree.file("production", "alpha", &format!("lib/{rel}"), script, mode);
    };
    for v in ["1.0.0", "1.0.1-dev", "1.0.1", "2.0.0"] {
        put(
            format!("packer/site/{}", name("hello", v)),
            describe_script(v, "x1.0"),
            0o755,
        );
    }
    put(
        format!("packer/site/{}", name("liar", "1.0.0")),
        describe_script("1.0.2", "x1.0"),
        0o755,
    );
    put(
        format!("packer/site/{}", name("noexec", "1.0.0")),
        describe_script("1.0.0", "x1.0"),
        0o644,
    );
    put(
        format!("packer/site/pluginsync-plugin-hello_v9.0.0_x1.0_{other}_{arch}"),
        describe_script("9.0.0", "x1.0"),
        0o755,
    );
    // `base` sorts (and loads) before `site`, but `site` is the first root.
    put(
        format!("packer/base/{}", name("shared", "5.0.0")),
        describe_script("5.0.0", "x1.0"),
        0o755,
    );
    put(
        format!("packer/site/{}", name("shared", "1.0.0")),
        describe_script("1.0.0", "x1.0"),
        0o755,
    );
    let config = r#"
[load]
enabled = true

[load.constraints]
hello = "< 2.0.0"

[[loader]]
match = "packer/**"
kind = "describe"
roots = ["packer/site", "packer/base"]
"#;
    let (home, l, rows) = sync_and_list(&tree, config);
    let p = |rel: String| format!("plugins/packer/{rel}");
    for v in ["1.0.0", "1.0.1-dev", "1.0.1", "2.0.0"] {
        expect(&l, &p(format!("site/{}", name("hello", v))), "ok", "");
    }
    let hello = active(&rows, "hello");
    assert_eq!(
        hello.0, "1.0.1",
        "the release over its -dev, 2.0.0 outside the constraint"
    );
    assert_eq!(rows["hello"].len(), 4, "{rows:#?}");
    expect(
        &l,
        &p(format!("site/{}", name("liar", "1.0.0"))),
        "failed",
        "describe says version 1.0.2 but the name says 1.0.0",
    );
    expect(
        &l,
        &p(format!("site/{}", name("noexec", "1.0.0"))),
        "failed",
        "not executable",
    );
    expect(
        &l,
        &p(format!(
            "site/pluginsync-plugin-hello_v9.0.0_x1.0_{other}_{arch}"
        )),
        "skipped",
        "this host is",
    );
    assert_eq!(
        active(&rows, "shared"),
        (
            "1.0.0".into(),
            home.libdir()
                .join("packer/site")
                .join(name("shared", "1.0.0"))
                .display()
                .to_string()
        ),
        "the first root wins over a higher version in a later one"
    );
    assert_eq!(rows["shared"].len(), 1, "{rows:#?}");
    assert!(!rows.contains_key("liar") && !rows.contains_key("noexec"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn celerity_layout() {
    let tree = EnvTree::new();
    let marks = tempfile::tempdir().unwrap();
    let put = |rel: &str, content: &[u8], mode: u32| {
        tree.file(
            "production",
            "alpha",
            &format!("lib/celerity/{rel}"),
            content,
            mode,
        );
    };
    let ok = |v: &str, id: &str| describe_with_id(v, "1.0", id);
    for v in ["1.0.0", "1.1.0", "2.0.0"] {
        put(
            &format!("site/providers/celerity/aws/{v}/plugin"),
            ok(v, "celerity/aws").as_bytes(),
            0o755,
        );
    }
    put(
        "site/providers/celerity/aws/1.1.0/schema.json",
        b"{}",
        0o644,
    );
    put(
        "site/transformers/registry.example.com/celerity/azure/1.0.0/plugin",
        ok("1.0.0", "registry.example.com/celerity/azure").as_bytes(),
        0o755,
    );
    put(
        "site/providers/celerity/liar/1.0.0/plugin",
        ok("1.0.1", "celerity/liar").as_bytes(),
        0o755,
    );
    put(
        "site/providers/celerity/noexec/1.0.0/plugin",
        ok("1.0.0", "celerity/noexec").as_bytes(),
        0o644,
    );
    put(
        "site/providers/celerity/foreign/1.0.0/plugin",
        &foreign_elf(),
        0o755,
    );
    // The same ID as a provider and as a transformer: both refused.
    put(
        "site/providers/acme/widget/1.0.0/plugin",
        ok("1.0.0", "acme/widget").as_bytes(),
        0o755,
    );
    put(
        "site/transformers/acme/widget/1.0.0/plugin",
        ok("1.0.0", "acme/widget").as_bytes(),
        0o755,
    );
    // `base` sorts (and loads) before `site`, but `site` is the first root.
    put(
        "base/providers/celerity/dns/3.0.0/plugin",
        ok("3.0.0", "celerity/dns").as_bytes(),
        0o755,
    );
    put(
        "site/providers/celerity/dns/1.0.0/plugin",
        ok("1.0.0", "celerity/dns").as_bytes(),
        0o755,
    );
    // Fails its first four launches (two exits, two hangs past the
    // deadline), answers on the fifth: Celerity's default attempt limit.
    let count = marks.path().join("flaky");
    put(
        "site/providers/celerity/flaky/1.0.0/plugin",
        format!(
            "#!/bin/sh\necho x >> {count}\nn=$(wc -l < {count})\n[ $n -le 2 ] && exit 1\n[ $n -le 4 ] && exec sleep 300\necho '{{\"version\":\"1.0.0\",\"api_version\":\"1.0\"}}'\n",
            count = count.display()
        )
        .as_bytes(),
        0o755,
    );
    // Never answers; leaves a child behind at every launch.
    let pids = marks.path().join("pids");
    put(
        "site/providers/celerity/mute/1.0.0/plugin",
        format!(
            "#!/bin/sh\nsleep 300 &\necho $! >> {pids}\nwait\n",
            pids = pids.display()
        )
        .as_bytes(),
        0o755,
    );
    let config = r#"
[load]
enabled = true

[load.constraints]
"celerity/aws" = "~> 1.0"

[[loader]]
name = "celerity"
match = "celerity/**"
kind = "describe"
layout = "celerity"
roots = ["celerity/site", "celerity/base"]
timeout = "2s"
"#;
    let (home, l, rows) = sync_and_list(&tree, config);
    let p = |rel: &str| format!("plugins/celerity/{rel}");
    let lib = |rel: &str| {
        home.libdir()
            .join("celerity")
            .join(rel)
            .display()
            .to_string()
    };
    for v in ["1.0.0", "1.1.0", "2.0.0"] {
        expect(
            &l,
            &p(&format!("site/providers/celerity/aws/{v}/plugin")),
            "ok",
            "",
        );
    }
    assert_eq!(
        active(&rows, "celerity/aws"),
        (
            "1.1.0".into(),
            lib("site/providers/celerity/aws/1.1.0/plugin")
        ),
        "the highest within ~> 1.0"
    );
    expect(
        &l,
        &p("site/providers/celerity/aws/1.1.0/schema.json"),
        "skipped",
        "named 'plugin'",
    );
    assert_eq!(
        active(&rows, "registry.example.com/celerity/azure").0,
        "1.0.0"
    );
    expect(
        &l,
        &p("site/providers/celerity/liar/1.0.0/plugin"),
        "failed",
        "describe says version 1.0.1 but the name says 1.0.0",
    );
    expect(
        &l,
        &p("site/providers/celerity/noexec/1.0.0/plugin"),
        "failed",
        "not executable",
    );
    expect(
        &l,
        &p("site/providers/celerity/foreign/1.0.0/plugin"),
        "failed",
        "Exec format error",
    );
    for t in ["providers", "transformers"] {
        expect(
            &l,
            &p(&format!("site/{t}/acme/widget/1.0.0/plugin")),
            "failed",
            "both a provider and a transformer",
        );
    }
    assert!(!rows.contains_key("acme/widget"), "{rows:#?}");
    assert_eq!(
        active(&rows, "celerity/dns"),
        (
            "1.0.0".into(),
            lib("site/providers/celerity/dns/1.0.0/plugin")
        ),
        "the first root wins"
    );
    assert_eq!(rows["celerity/dns"].len(), 1, "{rows:#?}");
    expect(
        &l,
        &p("site/providers/celerity/flaky/1.0.0/plugin"),
        "ok",
        "",
    );
    assert_eq!(
        std::fs::read_to_string(&count).unwrap().lines().count(),
        5,
        "launched five times"
    );
    assert_eq!(active(&rows, "celerity/flaky").0, "1.0.0");
    expect(
        &l,
        &p("site/providers/celerity/mute/1.0.0/plugin"),
        "failed",
        "timed out after 2s (killed with its process group) (attempt 5 of 5)",
    );
    let children = std::fs::read_to_string(&pids).unwrap();
    assert_eq!(
        children.lines().count(),
        5,
        "one child per launch: {children}"
    );
    for pid in children.lines() {
        assert!(
            dead(pid),
            "the mute plugin's child {pid} was killed with it"
        );
    }
    for gone in [
        "celerity/liar",
        "celerity/noexec",
        "celerity/foreign",
        "celerity/mute",
    ] {
        assert!(!rows.contains_key(gone), "{gone}: {rows:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kustomize_layout() {
    let tree = EnvTree::new();
    let marks = tempfile::tempdir().unwrap();
    let put = |rel: &str, content: &[u8], mode: u32| {
        tree.file("production", "alpha", &format!("lib/{rel}"), content, mode);
    };
    let g = "someteam.example.com";
    for (v, semver) in [("v1", "1.4.0"), ("v2", "2.0.0")] {
        put(
            &format!("kustomize/site/{g}/{v}/chartinflator/ChartInflator"),
            describe_with_id(semver, "1", &format!("{g}/{v}/ChartInflator")).as_bytes(),
            0o755,
        );
    }
    put(
        &format!("kustomize/site/{g}/v1/chartinflator/ChartInflator_test.go"),
        b"package main\n",
        0o644,
    );
    put(
        &format!("kustomize/site/{g}/v1/liar/Liar"),
        describe_with_id("1.0.0", "1", &format!("{g}/v2/Liar")).as_bytes(),
        0o755,
    );
    put(
        &format!("kustomize/site/{g}/v1/noexec/NoExec"),
        describe_with_id("1.0.0", "1", &format!("{g}/v1/NoExec")).as_bytes(),
        0o644,
    );
    put(
        &format!("kustomize/site/{g}/v1/foreign/Foreign"),
        &foreign_elf(),
        0o755,
    );
    // `base` sorts (and loads) before `site`, but `site` is the first root.
    put(
        "kustomize/base/v1/sedtransformer/SedTransformer",
        describe_with_id("3.0.0", "1", "v1/SedTransformer").as_bytes(),
        0o755,
    );
    put(
        "kustomize/site/v1/sedtransformer/SedTransformer",
        describe_with_id("1.0.0", "1", "v1/SedTransformer").as_bytes(),
        0o755,
    );
    // Without the handshake (kustomize's default) nothing runs at load.
    let ran = marks.path().join("ran");
    put(
        &format!("exec/{g}/v1/bashedconfigmap/BashedConfigMap"),
        format!("#!/bin/sh\necho \"$@\" >> {}\n", ran.display()).as_bytes(),
        0o755,
    );
    let config = r#"
[load]
enabled = true

[load.constraints]
"someteam.example.com/v2/ChartInflator" = "< 2.0.0"

[[loader]]
name = "kustomize"
match = "kustomize/**"
kind = "describe"
layout = "kustomize"
handshake = true
roots = ["kustomize/site", "kustomize/base"]

[[loader]]
name = "exec plugins"
match = "exec/**"
kind = "describe"
layout = "kustomize"
roots = ["exec"]
"#;
    let (home, l, rows) = sync_and_list(&tree, config);
    let p = |rel: &str| format!("plugins/kustomize/{rel}");
    let lib = |rel: &str| {
        home.libdir()
            .join("kustomize")
            .join(rel)
            .display()
            .to_string()
    };
    // kustomize runs exactly the apiVersion a configuration names: each
    // apiVersion is its own identity, and a constraint applies to it alone.
    assert_eq!(
        active(&rows, &format!("{g}/v1/ChartInflator")),
        (
            "1.4.0".into(),
            lib(&format!("site/{g}/v1/chartinflator/ChartInflator"))
        )
    );
    let v2 = &rows[&format!("{g}/v2/ChartInflator")];
    assert_eq!(
        (v2.len(), v2[0].0.as_str(), v2[0].1.as_str()),
        (1, "2.0.0", "available"),
        "registered, outside its constraint: {rows:#?}"
    );
    expect(
        &l,
        &p(&format!("site/{g}/v1/chartinflator/ChartInflator_test.go")),
        "skipped",
        "not the exec plugin",
    );
    expect(
        &l,
        &p(&format!("site/{g}/v1/liar/Liar")),
        "failed",
        &format!("describe says id '{g}/v2/Liar' but the path says '{g}/v1/Liar'"),
    );
    expect(
        &l,
        &p(&format!("site/{g}/v1/noexec/NoExec")),
        "failed",
        "not executable",
    );
    expect(
        &l,
        &p(&format!("site/{g}/v1/foreign/Foreign")),
        "failed",
        "Exec format error",
    );
    assert_eq!(
        active(&rows, "v1/SedTransformer"),
        ("1.0.0".into(), lib("site/v1/sedtransformer/SedTransformer")),
        "the first root wins"
    );
    assert_eq!(rows["v1/SedTransformer"].len(), 1, "{rows:#?}");
    expect(
        &l,
        &format!("plugins/exec/{g}/v1/bashedconfigmap/BashedConfigMap"),
        "ok",
        "",
    );
    assert_eq!(active(&rows, &format!("{g}/v1/BashedConfigMap")).0, "v1");
    assert!(!ran.exists(), "no handshake: the plugin never ran");
    for gone in ["Liar", "NoExec", "Foreign"] {
        assert!(!rows.contains_key(&format!("{g}/v1/{gone}")), "{rows:#?}");
    }
}

/// True if `pid` is not running (gone, or a zombie nobody reaped yet).
fn dead(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
        Err(_) => true,
        Ok(stat) => {
            stat.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next())
                == Some("Z")
        }
    }
}
