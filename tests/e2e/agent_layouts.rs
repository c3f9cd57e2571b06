//! `describe` loaders in the other plugin systems' layouts (issue 13), with
//! real child processes: Terraform's `terraform-provider-<name>_v<X.Y.Z>`
//! releases in `<os>_<arch>` directories, the highest within a constraint
//! active, a local build in `host_dir` preferred over every release, a
//! provider whose name and handshake disagree, a non-executable one, one
//! for another os/arch (skipped, as Terraform never looks there), and two
//! roots holding one identity (the first root's wins).

use pluginsync_agent::plugins::{host_arch, host_os};
use pluginsync_tests::{AgentHome, EnvTree, Pki, TestMaster, config_toml, parse_config};

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
