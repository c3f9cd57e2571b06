//! Node reports written behind the requests: a request hands its record
//! to [`Writer::push`] (a map insert, never the database), and what it
//! was served to [`Writer::served`]; a thread
//! writes what is pending every [`INTERVAL`] in one transaction. Bounded:
//! one pending record per node (the latest), at most `capacity` nodes; a
//! record beyond is counted in [`Writer::dropped`], not kept. A write that
//! fails keeps its records pending (unless a later one of the same node
//! came meanwhile), written when the database answers again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use pluginsync_common::mutex::lock;

use super::{NodeRow, ServedRow, StateStore};

/// How often pending records are written.
pub const INTERVAL: Duration = Duration::from_millis(200);
/// How often nodes beyond the bound are forgotten in the database.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The write-behind queue of node records (module docs).
#[derive(Debug)]
pub struct Writer {
    store: Arc<StateStore>,
    pending: Mutex<HashMap<String, NodeRow>>,
    served: Mutex<Vec<ServedRow>>,
    capacity: usize,
    max_nodes: usize,
    /// Serializes writes (the thread's and [`Writer::flush`]'s).
    writing: Mutex<()>,
    /// Records not kept because the queue was full.
    pub dropped: AtomicU64,
}

impl Writer {
    /// A queue of at most `capacity` nodes into `store`, which keeps at
    /// most `max_nodes`, and its thread (which ends with the queue).
    pub fn start(store: Arc<StateStore>, capacity: usize, max_nodes: usize) -> Arc<Writer> {
        let w = Arc::new(Writer {
            store,
            pending: Mutex::default(),
            served: Mutex::default(),
            capacity,
            max_nodes,
            writing: Mutex::new(()),
            dropped: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&w);
        let spawned = std::thread::Builder::new()
            .name("state-writer".into())
            .spawn(move || run(&weak));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "state store writer not started: node reports are not kept");
        }
        w
    }

    /// Queues `row`; false if the queue was full.
    pub fn push(&self, row: NodeRow) -> bool {
        let mut q = lock(&self.pending);
        if q.len() >= self.capacity && !q.contains_key(&row.certname) {
            self.dropped.fetch_add(1, Relaxed);
            return false;
        }
        q.insert(row.certname.clone(), row);
        true
    }

    /// Queues a generation served to a node; false if the queue was full.
    pub fn served(&self, row: ServedRow) -> bool {
        let mut q = lock(&self.served);
        if q.len() >= self.capacity {
            self.dropped.fetch_add(1, Relaxed);
            return false;
        }
        q.push(row);
        true
    }

    /// Records waiting to be written.
    pub fn pending(&self) -> usize {
        lock(&self.pending).len()
    }

    /// Writes what is pending now (nothing pending: the database is not
    /// touched); how many node records it wrote, or the store's error if
    /// it failed (the records stay pending).
    pub fn flush(&self) -> Result<usize, super::StoreError> {
        let _one = lock(&self.writing);
        let rows: Vec<NodeRow> = lock(&self.pending).drain().map(|(_, r)| r).collect();
        let served = std::mem::take(&mut *lock(&self.served));
        if rows.is_empty() && served.is_empty() {
            return Ok(0);
        }
        let count = rows.len();
        let written = self.store.write_nodes(&rows, &served);
        if written.is_err() {
            let mut q = lock(&self.served);
            let room = self.capacity.saturating_sub(q.len());
            q.extend(served.into_iter().take(room));
            let mut q = lock(&self.pending);
            for r in rows {
                if q.len() < self.capacity || q.contains_key(&r.certname) {
                    q.entry(r.certname.clone()).or_insert(r);
                }
            }
        }
        written.map(|()| count)
    }
}

/// The thread: write every [`INTERVAL`], prune every [`PRUNE_EVERY`]
/// if nodes were written since; one log line when writes start failing
/// and one when they recover.
fn run(writer: &Weak<Writer>) {
    let mut failing = false;
    let mut pruned = Instant::now();
    let mut written = 0;
    loop {
        std::thread::sleep(INTERVAL);
        let Some(w) = writer.upgrade() else { return };
        match w.flush() {
            Ok(n) if failing => {
                (failing, written) = (false, written + n);
                tracing::warn!(place = %w.store.place(), "state store: node reports written again");
            }
            Ok(n) => written += n,
            Err(e) if !failing => {
                failing = true;
                tracing::error!(error = %e, pending = w.pending(), "node reports not written: kept until the state store answers");
            }
            Err(_) => {}
        }
        if written > 0 && pruned.elapsed() >= PRUNE_EVERY {
            written = 0;
            pruned = Instant::now();
            if let Err(e) = w.store.prune_nodes(w.max_nodes) {
                tracing::warn!(error = %e, "state store: old nodes not pruned");
            }
        }
    }
}
