//! Replays the committed fuzz inputs through the same
//! target bodies libFuzzer runs (`pluginsync_fuzz::TARGETS`), as an
//! ordinary test: `cargo test --workspace` (and so `.ci/run`) checks every
//! input's properties on stable Rust, without the fuzzer. The inputs: the
//! hand-picked seeds (`fuzz/seeds/<target>/`), the corpus the fuzzer grew
//! from them, minimized with `cargo fuzz cmin` (`fuzz/corpus/<target>/`),
//! and the reproducers of crashes it found, now fixed
//! (`fuzz/artifacts/<target>/`). See fuzz/README.md.

use std::path::{Path, PathBuf};

/// The files directly under `dir`, sorted; none if it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = rd
        .map(|e| e.expect("read corpus directory").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn corpus_replays_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut failures = Vec::new();
    for (name, body) in pluginsync_fuzz::TARGETS {
        let seeds = inputs(&root.join("seeds").join(name));
        let corpus = inputs(&root.join("corpus").join(name));
        for (dir, files) in [("seeds", &seeds), ("corpus", &corpus)] {
            assert!(!files.is_empty(), "fuzz/{dir}/{name}/ is empty");
        }
        let artifacts = inputs(&root.join("artifacts").join(name));
        for file in seeds.iter().chain(&corpus).chain(&artifacts) {
            let data = std::fs::read(file).expect("read corpus input");
            if std::panic::catch_unwind(|| body(&data)).is_err() {
                failures.push(file.display().to_string());
            }
        }
        println!(
            "{name}: {} seeds, {} corpus inputs, {} reproducers",
            seeds.len(),
            corpus.len(),
            artifacts.len()
        );
    }
    assert!(
        failures.is_empty(),
        "inputs that fail their target: {failures:#?}"
    );
}

#[test]
fn every_target_has_a_cargo_fuzz_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("libfuzzer/Cargo.toml")).expect("manifest");
    for (name, _) in pluginsync_fuzz::TARGETS {
        let src = root
            .join("libfuzzer/fuzz_targets")
            .join(format!("{name}.rs"));
        let text =
            std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        assert!(
            text.contains(&format!("pluginsync_fuzz::{name}(")),
            "{} does not call the shared body",
            src.display()
        );
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{name} not in libfuzzer/Cargo.toml"
        );
    }
}
