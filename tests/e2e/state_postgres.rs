//! The state store's PostgreSQL backend against a real PostgreSQL
//! (docs/operating.md#the-state-store): what is written is read back by
//! another store, replicas starting at once migrate once, a newer schema
//! is refused with one line, a database away answers an error within the
//! query timeout, `sslmode` never falls back to plaintext where the URL
//! forbids it, and `verify-full`/`verify-ca` check a TLS server's
//! certificate against the CA (and the name); a batch of node records
//! written at once leaves what row-by-row upserts would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pluginsync_common::generation::GenerationId;
use pluginsync_master::statestore::{CommandRow, NodeRow, ServedRow, Settings, StateStore};
use pluginsync_tests::Postgres;

fn g(n: u8) -> GenerationId {
    GenerationId(pluginsync_common::digest::Sha256::of(&[n]))
}

fn open(url: &str) -> Result<StateStore, String> {
    let settings = Settings::parse(Some(url), 4, std::path::Path::new("/")).unwrap();
    StateStore::open(&settings).map_err(|e| e.to_string())
}

fn node(name: &str, at: u64) -> NodeRow {
    NodeRow {
        certname: name.into(),
        environment: "production".into(),
        generation: Some(g(1)),
        last_seen_ms: at,
        source: "report".into(),
        loads_ok: 3,
        loads_failed: 1,
        failed: vec!["facter/bad.rb".into()],
    }
}

#[test]
fn what_one_replica_writes_another_reads() {
    let Some(pg) = Postgres::launch("what_one_replica_writes_another_reads") else {
        return;
    };
    let url = pg.database();
    let a = open(&url).unwrap();
    let b = open(&url).unwrap();
    assert_ne!(
        a.origin().unwrap(),
        b.origin().unwrap(),
        "replicas of one database keep names of their own"
    );
    let row = CommandRow {
        environment: "production".into(),
        clock: 1,
        origin: a.origin().unwrap(),
        halt: Some((a.now().unwrap(), "halted by op".into())),
        promoted: Some(g(1)),
        withdrawn: vec![g(2), g(3)],
        waived: None,
        promoted_before: vec![g(4)],
    };
    a.write_commands(std::slice::from_ref(&row), "halt", "op")
        .unwrap();
    let served = ServedRow {
        certname: "n1".into(),
        environment: "production".into(),
        generation: g(1),
        replica: a.origin().unwrap(),
        at_ms: 4500,
    };
    a.write_nodes(&[node("n1", 5000)], std::slice::from_ref(&served))
        .unwrap();
    b.write_nodes(
        &[NodeRow {
            generation: None,
            ..node("n1", 4000)
        }],
        &[],
    )
    .unwrap();
    a.add_seen("production", &[g(1), g(2), g(3)], 2).unwrap();
    assert_eq!(b.commands().unwrap(), vec![row]);
    assert_eq!(
        b.nodes(10).unwrap(),
        vec![node("n1", 5000)],
        "an older record loses"
    );
    assert_eq!(b.served().unwrap(), vec![served]);
    let seen: Vec<_> = b.seen().unwrap().into_iter().map(|s| s.1).collect();
    assert_eq!(seen, vec![g(2), g(3)]);
    let history = b.history("production", 10).unwrap();
    assert_eq!(
        (history[0].1.as_str(), history[0].2.as_str()),
        ("halt", "op")
    );
    let rows: Vec<NodeRow> = (0..5).map(|i| node(&format!("m{i}"), 6000 + i)).collect();
    b.write_nodes(&rows, &[]).unwrap();
    assert_eq!(a.prune_nodes(3).unwrap(), 3);
    assert_eq!(a.nodes(10).unwrap().len(), 3);
    let now = a.now().unwrap();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (now - wall).abs() < 5,
        "the database's time: {now} against {wall}"
    );
}

/// A batch of node records is written as one statement per table
/// (docs/operating.md#the-state-store), beyond one statement's rows too,
/// and leaves what one upsert per row in the order given leaves (the
/// embedded store, row by row, is the reference); a replica's fleet reads
/// no node at start and reads one it has not heard from the store
/// (docs/operating.md#the-fleet); pruning drops the pruned nodes' served rows.
#[test]
fn a_batch_leaves_what_row_by_row_upserts_would_and_a_replica_reads_nodes_on_demand() {
    let Some(pg) = Postgres::launch("a_batch_leaves_what_row_by_row_upserts_would") else {
        return;
    };
    let url = pg.database();
    let a = Arc::new(open(&url).unwrap());
    let lite = StateStore::in_memory();
    let mut rows: Vec<NodeRow> = (0..12_000u64)
        .map(|i| node(&format!("b{i:05}"), 1000 + i))
        .collect();
    let as_late_after = NodeRow {
        loads_ok: 7,
        ..node("b00001", 1001)
    };
    let earlier = NodeRow {
        loads_ok: 9,
        generation: None,
        ..node("b00002", 1)
    };
    let later = NodeRow {
        loads_ok: 8,
        ..node("b00003", 90_000)
    };
    rows.extend([as_late_after, earlier, later]);
    let served = |generation: u8, at_ms: u64| ServedRow {
        certname: "b00001".into(),
        environment: "production".into(),
        generation: g(generation),
        replica: "r".into(),
        at_ms,
    };
    let to = [served(1, 30), served(1, 10), served(2, 20)];
    a.write_nodes(&rows, &to).unwrap();
    lite.write_nodes(&rows, &to).unwrap();
    for name in ["b00000", "b00001", "b00002", "b00003", "b11999"] {
        assert_eq!(a.node(name).unwrap(), lite.node(name).unwrap(), "{name}");
    }
    let (one, to_one) = a.node("b00001").unwrap().unwrap();
    assert_eq!(one.loads_ok, 7, "as late, given after: it wins");
    assert_eq!(
        to_one,
        vec![g(2), g(1)],
        "each served row kept from its first"
    );
    assert_eq!(
        a.node("b00002").unwrap().unwrap().0.loads_ok,
        3,
        "earlier: it loses"
    );
    assert_eq!(a.nodes(20_000).unwrap().len(), 12_000);

    let config = pluginsync_master::config::FleetConfig::default();
    let fleet = pluginsync_master::fleet::Fleet::with_store(&config, a.clone()).unwrap();
    assert_eq!(fleet.len(), 0, "a replica reads no node at start");
    let record = fleet.record_of("b00003").expect("read from the store");
    assert_eq!((record.loads_ok, fleet.len()), (8, 1));
    assert!(fleet.record_of("nobody").is_none());
    drop(fleet);

    assert_eq!(a.prune_nodes(100).unwrap(), 11_900);
    let left = pg.sql(&url, "SELECT count(*) FROM served");
    assert_eq!(
        left.trim(),
        "0",
        "b00001 was pruned: so is what was served to it"
    );
}

#[test]
fn replicas_starting_at_once_migrate_once_and_a_newer_schema_is_refused() {
    let Some(pg) = Postgres::launch("replicas_starting_at_once_migrate_once") else {
        return;
    };
    let url = pg.database();
    let opened: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || open(&url).map(|s| s.schema().unwrap()))
        })
        .collect();
    for t in opened {
        let (found, known) = t.join().unwrap().unwrap();
        assert_eq!(found, known);
    }
    let versions = pg.sql(
        &url,
        "SELECT count(*), count(DISTINCT version) FROM schema_migrations",
    );
    let (rows, distinct) = versions.split_once('|').unwrap();
    assert_eq!(rows, distinct, "each version applied once: {versions}");
    pg.sql(&url, "INSERT INTO schema_migrations VALUES (999, 0)");
    let e = open(&url).unwrap_err();
    assert!(
        e.contains("schema version 999 is newer than this pluginsync-master"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn a_database_away_answers_an_error_within_the_timeout_and_then_again_data() {
    let Some(pg) = Postgres::launch("a_database_away_answers_an_error") else {
        return;
    };
    let url = pg.database();
    let store = Arc::new(open(&url).unwrap());
    store.write_nodes(&[node("n1", 1000)], &[]).unwrap();
    pg.stop();
    let t = Instant::now();
    let e = store.nodes(10).unwrap_err().to_string();
    assert!(t.elapsed() < Duration::from_secs(7), "{:?}", t.elapsed());
    assert!(e.starts_with("state store postgresql://"), "{e}");
    assert!(!e.contains('\n'), "{e}");
    pg.start();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match store.nodes(10) {
            Ok(rows) => {
                assert_eq!(rows, vec![node("n1", 1000)]);
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "not back within 5 s: {e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn sslmode_decides_plaintext_and_a_unix_socket_is_a_host() {
    let Some(pg) = Postgres::launch("sslmode_decides_plaintext") else {
        return;
    };
    let url = pg.database();
    let name = url.rsplit('/').next().unwrap().split('?').next().unwrap();
    let base = format!("postgresql://postgres@127.0.0.1:{}/{name}", pg.port());
    // The server has no TLS: `prefer` falls back, `require` and stricter do not.
    open(&format!("{base}?sslmode=prefer")).unwrap();
    open(&base).unwrap();
    let e = open(&format!("{base}?sslmode=require")).unwrap_err();
    assert!(e.contains("state store") && !e.contains('\n'), "{e}");
    let pki = pluginsync_tests::Pki::new();
    let ca = pki.ca();
    let e = open(&format!(
        "{base}?sslmode=verify-full&sslrootcert={}",
        ca.display()
    ))
    .unwrap_err();
    assert!(e.contains("state store"), "{e}");
    let e = open(&format!("{base}?sslmode=verify-ca")).unwrap_err();
    assert!(e.contains("needs sslrootcert"), "{e}");
    let socket = format!(
        "postgresql://postgres@/{name}?host={}&port={}",
        pg.socket_dir().display(),
        pg.port()
    );
    open(&socket).unwrap().nodes(1).unwrap();
}

#[test]
fn verify_full_checks_the_ca_and_the_name_and_verify_ca_the_ca_only() {
    let Some(pg) = Postgres::launch("verify_full_checks_the_ca_and_the_name") else {
        return;
    };
    let pki = pluginsync_tests::Pki::new();
    pg.serve_tls(&pki.cert("localhost"), &pki.key("localhost"));
    let url = pg.database();
    let name = url.rsplit('/').next().unwrap().split('?').next().unwrap();
    let ca = pki.ca();
    let at = |host: &str, mode: &str, ca: &std::path::Path| {
        format!(
            "postgresql://postgres@{host}:{}/{name}?hostaddr=127.0.0.1&sslmode={mode}&sslrootcert={}",
            pg.port(),
            ca.display()
        )
    };
    open(&at("localhost", "verify-full", &ca))
        .unwrap()
        .nodes(1)
        .unwrap();
    open(&at("localhost", "require", &ca)).unwrap();
    open(&format!(
        "postgresql://postgres@127.0.0.1:{}/{name}?sslmode=require",
        pg.port()
    ))
    .unwrap();
    let e = open(&at("db.example.org", "verify-full", &ca)).unwrap_err();
    assert!(e.contains("state store") && !e.contains('\n'), "{e}");
    open(&at("db.example.org", "verify-ca", &ca)).unwrap();
    let other = pluginsync_tests::Pki::new();
    let e = open(&at("localhost", "verify-ca", &other.ca())).unwrap_err();
    assert!(e.contains("state store"), "another CA: {e}");
    let e = open(&at("localhost", "require", &other.ca())).unwrap_err();
    assert!(
        e.contains("state store"),
        "require with a root verifies it: {e}"
    );
}
