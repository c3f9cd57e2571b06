//! A test-only signer of TUF repositories, with `tough`'s own editor
//! (docs/trust.md#the-signing-pipeline: in production, `tuftool`): a root
//! with threshold 2 of 3 keys, a targets key, a snapshot key and a
//! timestamp key, all P-256 (PKCS#8 DER) and made per signer. [`TufSigner::publish`]
//! signs the targets held (each a generation's manifest) into a new
//! targets, snapshot and timestamp version, written in a metadata
//! directory as the masters carry it (`N.root.json`, `N.targets.json`,
//! `N.snapshot.json`, `timestamp.json`).

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aws_lc_rs::rand::SystemRandom;
use pluginsync_common::envname::EnvName;
use pluginsync_common::generation::GenerationId;
use pluginsync_common::trust::target_name;
use tough::editor::RepositoryEditor;
use tough::editor::signed::SignedRole;
use tough::key_source::{KeySource, LocalKeySource};
use tough::schema::decoded::{Decoded, Hex};
use tough::schema::{Hashes, KeyHolder, RoleKeys, RoleType, Root, Target};
use tough::sign::{Sign, parse_keypair};

/// Keys, targets and versions of one test repository.
pub struct TufSigner {
    keys: PathBuf,
    /// Where the metadata is written (a master's `[trust] metadata`).
    pub metadata: PathBuf,
    root_keys: Vec<PathBuf>,
    targets_key: PathBuf,
    root: Root,
    targets: BTreeMap<String, Target>,
    version: u64,
    /// The root version the editor signs under.
    signing_root: u64,
}

/// A new P-256 key, PKCS#8 DER (what tough reads for ECDSA), at `path`.
fn new_key(path: &Path) -> tough::schema::key::Key {
    let der = rcgen::KeyPair::generate().expect("key").serialize_der();
    std::fs::write(path, &der).expect("write key");
    parse_keypair(&der).expect("P-256 key").tuf_key()
}

fn sources(paths: &[&PathBuf]) -> Vec<Box<dyn KeySource>> {
    paths
        .iter()
        .map(|p| Box::new(LocalKeySource { path: (*p).clone() }) as Box<dyn KeySource>)
        .collect()
}

fn expiry(from_now: Duration) -> jiff::Timestamp {
    let now = jiff::Timestamp::now();
    now.checked_add(jiff::SignedDuration::try_from(from_now).expect("duration"))
        .expect("timestamp")
}

impl TufSigner {
    /// Keys made under `dir/keys`, version 1 of the root signed by two of
    /// its three keys and written in `dir/metadata`.
    pub async fn new(dir: &Path) -> TufSigner {
        let (keys, metadata) = (dir.join("keys"), dir.join("metadata"));
        std::fs::create_dir_all(&keys).unwrap();
        std::fs::create_dir_all(&metadata).unwrap();
        let mut root = Root {
            spec_version: "1.0.0".to_owned(),
            consistent_snapshot: true,
            version: NonZeroU64::MIN,
            expires: expiry(Duration::from_secs(365 * 86400)),
            keys: HashMap::new(),
            roles: HashMap::new(),
            _extra: HashMap::new(),
        };
        let role = |root: &mut Root, role: RoleType, names: &[&str], threshold: u64| {
            let mut ids = Vec::new();
            let mut paths = Vec::new();
            for n in names {
                let path = keys.join(format!("{n}.pk8"));
                let key = new_key(&path);
                let id = key.key_id().expect("key id");
                root.keys.insert(id.clone(), key);
                ids.push(id);
                paths.push(path);
            }
            root.roles.insert(role, role_keys(ids, threshold));
            paths
        };
        let root_keys = role(&mut root, RoleType::Root, &["root1", "root2", "root3"], 2);
        let targets_key = role(&mut root, RoleType::Targets, &["targets1"], 1).remove(0);
        role(&mut root, RoleType::Snapshot, &["snapshot"], 1);
        role(&mut root, RoleType::Timestamp, &["timestamp"], 1);
        let signer = TufSigner {
            keys,
            metadata,
            root_keys,
            targets_key,
            root,
            targets: BTreeMap::new(),
            version: 0,
            signing_root: 1,
        };
        signer.write_root().await;
        signer
    }

    /// The root a node installs (version 1).
    pub fn root_file(&self) -> PathBuf {
        self.metadata.join("1.root.json")
    }

    /// Signs the current root with two of the three root keys.
    async fn write_root(&self) {
        let keys = sources(&[&self.root_keys[0], &self.root_keys[1]]);
        let holder = KeyHolder::Root(self.root.clone());
        let signed = SignedRole::new(self.root.clone(), &holder, &keys, &SystemRandom::new())
            .await
            .expect("root signed");
        signed
            .write(&self.metadata, true)
            .await
            .expect("root written");
    }

    /// Adds `manifest` of `env` as a target (signed at the next
    /// [`TufSigner::publish`]).
    pub fn sign_manifest(&mut self, env: &str, manifest: &[u8]) -> String {
        let id = pluginsync_common::digest::Sha256::of(manifest);
        let env_name: EnvName = env.parse().expect("environment name");
        let name = target_name(&env_name, &GenerationId(id));
        let mut custom = HashMap::new();
        custom.insert("environment".to_owned(), serde_json::json!(env));
        let target = Target {
            length: manifest.len() as u64,
            hashes: Hashes {
                sha256: Decoded::from(id.0.to_vec()),
                _extra: HashMap::new(),
            },
            custom,
            _extra: HashMap::new(),
        };
        self.targets.insert(name.clone(), target);
        name
    }

    /// Adds the manifest of `env`'s tree as it is now, as the deploy
    /// pipeline computes it (`pluginsync-master manifest`, in-process), as
    /// a target (signed at the next [`TufSigner::publish`]); its id.
    pub fn sign_tree(
        &mut self,
        config: &pluginsync_master::config::MasterConfig,
        env: &str,
    ) -> pluginsync_common::generation::GenerationId {
        let (bytes, id) =
            pluginsync_master::trust::manifest::of_tree(config, env).expect("the tree's manifest");
        self.sign_manifest(env, &bytes);
        id
    }

    /// Removes a target (a withdrawn generation).
    pub fn withdraw(&mut self, name: &str) {
        self.targets.remove(name);
    }

    /// Signs the targets held into the next version of targets, snapshot
    /// and timestamp, expiring `expires_in` from now, and writes them.
    pub async fn publish(&mut self, expires_in: Duration) {
        self.version += 1;
        let v = NonZeroU64::new(self.version).expect("version");
        let at = expiry(expires_in);
        let root = self
            .metadata
            .join(format!("{}.root.json", self.signing_root));
        let mut editor = RepositoryEditor::new(root).await.expect("editor");
        editor
            .targets_version(v)
            .expect("targets version")
            .targets_expires(at)
            .expect("targets expiry")
            .snapshot_version(v)
            .snapshot_expires(at)
            .timestamp_version(v)
            .timestamp_expires(at);
        for (name, target) in &self.targets {
            editor
                .add_target(name.as_str(), target.clone())
                .expect("target");
        }
        let snapshot = self.keys.join("snapshot.pk8");
        let timestamp = self.keys.join("timestamp.pk8");
        let keys = sources(&[&self.targets_key, &snapshot, &timestamp]);
        let signed = editor.sign(&keys).await.expect("signed");
        signed.write(&self.metadata).await.expect("written");
    }

    /// A new root version whose targets key replaces the old one (the old
    /// key kept aside, its signatures no longer valid), signed by the root
    /// keys; publish again to sign with the new key.
    pub async fn rotate_targets_key(&mut self) -> PathBuf {
        let old = self.targets_key.clone();
        let n = self.root.version.get() + 1;
        let path = self.keys.join(format!("targets{n}.pk8"));
        let key = new_key(&path);
        let id = key.key_id().expect("key id");
        let old_ids = std::mem::take(
            &mut self
                .root
                .roles
                .get_mut(&RoleType::Targets)
                .expect("targets role")
                .keyids,
        );
        for o in old_ids {
            self.root.keys.remove(&o);
        }
        self.root.keys.insert(id.clone(), key);
        self.root
            .roles
            .insert(RoleType::Targets, role_keys(vec![id], 1));
        self.root.version = NonZeroU64::new(n).expect("version");
        self.write_root().await;
        self.targets_key = path;
        self.signing_root = n;
        old
    }

    /// From now on signs as whoever holds `key`, a targets key rotated
    /// out, would: under version 1 of the root, which still lists it.
    pub fn forge_with(&mut self, key: PathBuf) {
        self.targets_key = key;
        self.signing_root = 1;
    }
}

fn role_keys(keyids: Vec<Decoded<Hex>>, threshold: u64) -> RoleKeys {
    RoleKeys {
        keyids,
        threshold: NonZeroU64::new(threshold).expect("threshold"),
        _extra: HashMap::new(),
    }
}

/// The deploy pipeline, emulated for the suite's scenarios run with
/// `[trust]` on (docs/trust.md#the-signing-pipeline): a thread that signs
/// the manifest of each environment's tree whenever it changes (every
/// 100 ms), with a [`TufSigner`] of its own, so every generation a test
/// deploys is signed shortly after. [`Signing::off`] does nothing: the
/// same scenario runs both ways.
pub struct Signing {
    on: Option<Pipeline>,
}

struct Pipeline {
    metadata: PathBuf,
    root: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Signing {
    /// No signing: the scenario as without `[trust]`.
    pub fn off() -> Signing {
        Signing { on: None }
    }

    /// `trust`: [`Signing::start`] of `envs` of the master config `toml`
    /// (its `[trust]` tables not yet added), else [`Signing::off`].
    pub fn new(trust: bool, toml: &str, envs: &[&str]) -> Signing {
        match trust {
            true => Signing::start(toml, envs),
            false => Signing::off(),
        }
    }

    /// Signs the trees of `envs` as the master config `toml` reads them,
    /// now and whenever they change; returns once the trees as they are
    /// now are signed.
    pub fn start(toml: &str, envs: &[&str]) -> Signing {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = dir.path().to_owned();
        let config = pluginsync_master::config::MasterConfig::parse(toml, Path::new("/test"))
            .expect("config parses");
        let envs: Vec<String> = envs.iter().map(|e| (*e).to_owned()).collect();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let mut signer = rt.block_on(TufSigner::new(&repo));
            let _ = ready_tx.send((signer.metadata.clone(), signer.root_file()));
            let mut signed = std::collections::HashSet::new();
            while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
                let mut new = false;
                for env in &envs {
                    if let Ok((bytes, id)) =
                        pluginsync_master::trust::manifest::of_tree(&config, env)
                        && signed.insert((env.clone(), id))
                    {
                        signer.sign_manifest(env, &bytes);
                        new = true;
                    }
                }
                if new {
                    rt.block_on(signer.publish(Duration::from_secs(86400)));
                    let _ = ready_tx.send((PathBuf::new(), PathBuf::new()));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let (metadata, root) = ready_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the signer");
        let _first = ready_rx.recv_timeout(Duration::from_secs(60));
        Signing {
            on: Some(Pipeline {
                metadata,
                root,
                stop,
                thread: Some(thread),
                _dir: dir,
            }),
        }
    }

    /// Whether it signs.
    pub fn is_on(&self) -> bool {
        self.on.is_some()
    }

    /// The master's `[trust]` tables (empty when off): the metadata
    /// served, the root publication requires.
    pub fn master_tables(&self) -> String {
        self.on.as_ref().map_or_else(String::new, |p| {
            format!(
                "[trust]\nmetadata = {:?}\nroot = {:?}\n",
                p.metadata, p.root
            )
        })
    }

    /// The agent's `[trust]` table (empty when off).
    pub fn agent_table(&self) -> String {
        self.on
            .as_ref()
            .map_or_else(String::new, |p| format!("[trust]\nroot = {:?}\n", p.root))
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
