//! The background scrub of the generation store while the master serves
//! (docs/deploys.md#scrubbing-the-store): every `[generations]
//! scrub_interval`, one pass on a thread of its own (never on the request
//! path) hashes each blob and manifest again within `scrub_mib_per_second`;
//! a corrupt one is repaired by [`Generations::repair`], logged in one
//! line naming the file and what was done, and counted.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use pluginsync_common::digest::Sha256;

use crate::generations::{Generations, Limits, Repair, ScrubTarget};
use crate::store::Store;
use pluginsync_common::filesig::FileSig;

/// Starts the passes of `limits` on `store`, unless either knob is 0;
/// the thread ends when the store is gone.
pub fn start(store: &Arc<Store>, limits: &Limits) {
    let (interval, rate) = (limits.scrub_interval, limits.scrub_mib_per_second);
    if interval.is_zero() || rate == 0 {
        return;
    }
    let store = Arc::downgrade(store);
    let bytes_per_second = rate.saturating_mul(1 << 20);
    let started = std::thread::Builder::new()
        .name("store-scrub".into())
        .spawn(move || {
            loop {
                std::thread::sleep(interval);
                if pass(&store, bytes_per_second).is_none() {
                    return;
                }
            }
        });
    if let Err(e) = started {
        tracing::error!("generation store: no background scrub: {e}");
    }
}

/// One pass; `None` once the store is gone.
fn pass(store: &Weak<Store>, bytes_per_second: u64) -> Option<()> {
    let targets = store.upgrade()?.generations.scrub_targets();
    let (start, mut read) = (Instant::now(), 0u64);
    for (target, size) in targets {
        let s = store.upgrade()?;
        let g = &s.generations;
        if let Ok(Some(why)) = target.check() {
            g.corrupt.fetch_add(1, Ordering::Relaxed);
            repair(&s, &target, &why);
        }
        g.scrubbed_bytes.fetch_add(size, Ordering::Relaxed);
        drop(s);
        // Within the budget: a pass never reads faster than its rate.
        read = read.saturating_add(size);
        let due = Duration::from_secs_f64(read as f64 / bytes_per_second as f64);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    Some(())
}

/// Repairs `target` (corrupt: `why`) and says what was done, in one line
/// naming the file, never quoting it.
fn repair(store: &Store, target: &ScrubTarget, why: &str) {
    let file = target.path().display();
    let source = match target {
        ScrubTarget::Blob(_, d) => source_of(store, d),
        ScrubTarget::Manifest(..) => None,
    };
    let gens: &Generations = &store.generations;
    match gens.repair(target, source) {
        Ok(Repair::Sound) => {}
        Ok(Repair::Copied(from)) => tracing::warn!(
            "generation store: {file} was corrupt ({why}): copied again from {}",
            from.display()
        ),
        Ok(Repair::Withdrawn(list)) => {
            let names: Vec<String> = (list.iter())
                .map(|(e, id)| format!("{e} {}", id.short()))
                .collect();
            tracing::warn!(
                "generation store: {file} was corrupt ({why}) and no tree holds its bytes: removed, generations withdrawn: {}",
                match names.is_empty() {
                    true => "none".to_owned(),
                    false => names.join(", "),
                }
            );
        }
        Err(e) => {
            tracing::error!("generation store: {file} was corrupt ({why}) and not repaired: {e}")
        }
    }
}

/// An indexed file of a current tree said to hold `digest`'s bytes (the
/// copy hashes them again).
fn source_of(store: &Store, digest: &Sha256) -> Option<(PathBuf, FileSig)> {
    store.all().into_iter().find_map(|idx| {
        let (root, node) = idx.blob(digest)?;
        Some((node.real_path(&root.canon).into_owned(), node.sig?))
    })
}
