//! SIGTERM and SIGINT during a run (docs/operating.md#signals; without it a
//! `systemctl stop` in the middle of a commit used to leave a tree half old,
//! half new).
//!
//! [`Interrupts::listen`] takes both signals over for the rest of the
//! process: from then on neither kills the agent; [`crate::sync`] asks
//! [`Interrupts`] instead. Before the commit a signal stops the run (the
//! staging is dropped, so nothing changes); once the commit has started it
//! is only noted, the commit finishes, the cache and report are saved, and
//! the run ends with the signal's exit status ([`Interrupt::exit_status`])
//! without running its loads (they stay in `<vardir>/pending_loads.json` for
//! the next run). A second signal changes nothing; SIGKILL still stops the
//! agent at once (and the next run copes, as after any kill).
//!
//! The signals are received on a thread of their own with its own small
//! runtime, because the commit is synchronous work on the run's (single)
//! thread: a signal that arrives during it is still seen at once, and
//! [`Interrupts::received`] answers without an `.await`.
//!
//! On the signal that thread also kills every loader's process group: each
//! loader runs under a supervisor that leads a process group of its own
//! (docs/internals.md#load-launch-layouts-and-plugins), a direct child of the agent; those
//! groups get SIGKILL, so a loader never outlives the run it belongs to.

use std::sync::mpsc;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::exit::ExitStatus;

/// The signal that interrupted a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// SIGTERM (`systemctl stop`, shutdown).
    Term,
    /// SIGINT (Ctrl-C).
    Int,
}

impl Interrupt {
    /// `SIGTERM` or `SIGINT`.
    pub fn name(self) -> &'static str {
        match self {
            Interrupt::Term => "SIGTERM",
            Interrupt::Int => "SIGINT",
        }
    }

    /// 128 + the signal's number, as a shell reports a process killed by
    /// it: 143 and 130.
    pub fn exit_status(self) -> ExitStatus {
        match self {
            Interrupt::Term => ExitStatus::Terminated,
            Interrupt::Int => ExitStatus::Interrupted,
        }
    }
}

impl std::fmt::Display for Interrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether SIGTERM or SIGINT has arrived; cheap to clone.
#[derive(Debug, Clone)]
pub struct Interrupts {
    rx: watch::Receiver<Option<Interrupt>>,
    /// [`Interrupts::none`]: the sender, kept so that `wait` waits.
    _never: Option<std::sync::Arc<watch::Sender<Option<Interrupt>>>>,
}

impl Interrupts {
    /// Takes SIGTERM and SIGINT over (see the module docs); returns once
    /// both handlers are installed. Call once per process.
    pub fn listen() -> std::io::Result<Interrupts> {
        let (tx, rx) = watch::channel(None);
        let (ready_tx, ready_rx) = mpsc::channel::<std::io::Result<()>>();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let handlers = signal(SignalKind::terminate())
                        .and_then(|t| Ok((t, signal(SignalKind::interrupt())?)));
                    let (mut term, mut int) = match handlers {
                        Ok(h) => h,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    loop {
                        let which = tokio::select! {
                            _ = term.recv() => Interrupt::Term,
                            _ = int.recv() => Interrupt::Int,
                        };
                        // The first signal decides the exit status.
                        tx.send_if_modified(|s| s.is_none() && s.replace(which).is_none());
                        kill_loader_groups();
                    }
                });
            })?;
        ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("the signal thread died"))??;
        Ok(Interrupts { rx, _never: None })
    }

    /// Interrupts that never come (library use without [`Interrupts::listen`]).
    pub fn none() -> Interrupts {
        let (tx, rx) = watch::channel(None);
        Interrupts {
            rx,
            _never: Some(std::sync::Arc::new(tx)),
        }
    }

    /// The signal received so far, if any.
    pub fn received(&self) -> Option<Interrupt> {
        *self.rx.borrow()
    }

    /// Waits for a signal.
    pub async fn wait(&self) -> Interrupt {
        let mut rx = self.rx.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(s) => s.unwrap_or(Interrupt::Term),
            // The signal thread is gone: no signal will be reported.
            Err(_) => std::future::pending().await,
        }
    }
}

/// Sends SIGKILL to the process group of every direct child of the agent
/// that leads its own group: the loaders' supervisors, each with its loader
/// and whatever the loader started (`load.rs`, `run_isolated`). Found in
/// `/proc/<pid>/stat` (fields 4 and 5: parent and process group).
fn kill_loader_groups() {
    use rustix::process::{Pid, Signal, getpid, kill_process_group};
    let me = getpid().as_raw_nonzero().get();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp …`; comm may hold spaces and parens.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut fields = rest.split_whitespace().skip(1);
        let (ppid, pgrp) = (
            fields.next().and_then(|f| f.parse::<i32>().ok()),
            fields.next().and_then(|f| f.parse::<i32>().ok()),
        );
        if ppid == Some(me)
            && pgrp == Some(pid)
            && let Some(group) = Pid::from_raw(pid)
        {
            tracing::debug!(pid, "killing a loader's process group");
            let _already_gone = kill_process_group(group, Signal::KILL);
        }
    }
}
