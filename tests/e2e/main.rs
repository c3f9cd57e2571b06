//! End-to-end tests: a real master over real TLS on 127.0.0.1, real trees on
//! disk, real child processes (the binaries and, where installed, Puppet).

// ARCHITECTURE.md against the code (every module named, every arrow an import, every import drawn, no import cycles), the cited docs and headings, the size of functions and files.
mod architecture;
// Downloads failing over across replicas with equal listing ETags, and outlasting a master restart.
mod agent_failover;
// Fault injection: the agent killed with SIGKILL at random points of initial and incremental syncs.
mod agent_killed;
// What the agent makes durable, traced with strace: nothing for a no-op run, its own files for a small change, syncfs above the threshold.
mod agent_durable;
// The agent's removal guard: a master that lost most of an environment cannot wipe a node.
mod agent_guard;
// One generation per run: a deploy between the agent's requests, a wrong blob from a cache, bundles.
mod agent_generations;
// Loading synced plugins after a sync: loaders as child processes, failures, versions, the report.
mod agent_facts;
mod agent_load;
// The agent's textfile metrics after good and failed runs; `report` as a monitoring check.
mod agent_metrics;
// The agent on a Puppet node: settings from puppet.conf and their sources, the server-assigned environment, a Puppet run's lock waited for.
mod agent_puppetconf;
// Progress on a terminal during a long first sync; none in files.
mod agent_progress;
// Describe loaders in the four plugin systems' layouts (Packer, Terraform, Celerity, kustomize): identity, versions, roots, attempts.
mod agent_layouts;
// The agent's commit under faults: a racing user's symlinks, inodes running out, SIGTERM/SIGINT before, during and after the commit.
mod agent_faults;
// The agent against hostile masters and trees: modes, control characters, foreign hosts, unbounded answers.
mod agent_hostile;
// The agent binary syncing from a master: mirroring, reports, purge, errors, noop, lock, failover.
mod agent_sync;
// The switch of generations: a reader never sees two in one walk; rollback, rollback_on_failure; the in-place fallback.
mod agent_switch;
// `rollback` per generation: both mounts from one generation, refused when it is not kept, finished after a kill between two exchanges.
mod agent_switch_rollback;
// The node report right after the commit: the inventory current before the next run, --noop recording nothing, bad bodies refused.
mod agent_report;
// Certificate failures named in one line by the agent; expiry warnings.
mod certs;
// Exit statuses of both binaries: usage errors (64), config errors (78), --help.
mod cli_exit;
// No tests: helpers the modules share (Puppet's pluginsync query, GETting and reading listings).
mod common;
// Master processes behind HAProxy: syncs and ETags surviving a backend dying (needs `haproxy`).
mod haproxy_lb;
// A hundred agents behind nginx's cache from packaging/ in front of two masters: content leaves the masters about once, listings always reach one, a wrong cached blob is refused (needs `nginx`).
mod nginx_cache;
// Log lines under systemd: syslog priorities when stderr is the journal, one line per error.
mod logs;
// Content-addressed blobs by sha256 and batches of them: caching, authentication, authorization.
mod master_blobs;
// Generations: the per-node answer, manifests and deltas, kept generations outliving their trees and restarts, the store's dedupe, cache policies.
mod master_generations;
// The store's background scrub: a rewritten blob found, copied again from the tree or its generation withdrawn, counted.
mod master_scrub;
// Rollouts: waves placing 200 certnames alike on two replicas, the rollout commands, state kept and shared, 503 for a generation never held, bad policies.
mod master_rollout;
// The fleet: node reports and stock agents in the inventory of two peer replicas, bounded series, bad reports ignored.
mod master_fleet;
// The state store on a real PostgreSQL: shared by replicas, migrated once, refused when newer, an outage an error within the timeout, sslmode (needs `postgresql`).
mod state_postgres;
// The inventory for humans: the paged, filtered endpoint and `pluginsync-master inventory`'s table and JSON.
mod master_inventory;
// Deploys: flipped environment links, r10k and scripted redeploys held until they settle, explicit publishing.
mod master_deploy;
// A hundred environments: indexed on demand and in the background, one build per environment, dropped when idle.
mod master_envs;
// ETags across two master processes: equal for one tree, 304 from either, new on change, gzip.
mod master_etag;
// Delta listings: rebuilt byte for byte, fallbacks, replicas, the agent through a delta, stock agents never.
mod master_delta;
// environment.conf and a control repository as r10k deploys it; module roots kept in the code tree; quiet logs on deletes.
mod master_envconf;
// Hostile requests and trees: odd listing parameters, files swapped for symlinks or fifos, batch amplification, blob caching.
mod master_hostile;
// What clients can hold: idle and stalled connections, max_connections, revocation on SIGHUP and in the chain.
mod master_limits;
// Prometheus metrics of the real master: counters follow the traffic, promtool accepts them.
mod master_metrics;
// TLS sessions: a second connection resumes, a reload or restart forgets the tickets; a P-256 master key from the Puppet CA.
mod master_tls;
// What a listing says: checksums, order, first-wins collisions, ignores, links, modes.
mod master_listing;
// The master binary as a service manager sees it: SIGTERM, draining, exit status.
mod master_process;
// The `[proxy]` listener's trust model: identity headers only from trusted addresses, never on the mTLS port.
mod master_proxy;
// Exact bytes, Puppet's errors, traversal and symlink escapes, client certificates, authorization.
mod master_security;
// The index following the disk: changed files, environments created and removed after start.
mod master_watch;
// A stock `puppet plugin download` syncing from our master (needs `puppet`).
mod puppet_compat;
// A Puppet fleet behind HAProxy and nginx from packaging/: stock agents' runs split between Puppet Server and pluginsync masters, the ENC's environment (needs puppet, puppetserver, a balancer).
mod puppet_fleet;
// The health loop on a mixed fleet behind HAProxy (and to the halt behind nginx): Puppet Server, two masters, 24 of our agents, 4 stock ones; broken facts halt the first wave, the rollback moves no other node.
mod puppet_mixed_fleet;
// Puppet's own inventory: after our agent's sync and a stock run, PuppetDB's PQL answers the node's pluginsync fact (needs puppet, puppetserver, puppetdb, haproxy, PostgreSQL, root).
mod puppet_puppetdb;
// Stock agents' run reports through Puppet Server's `http` processor: their plugin errors in the inventory (needs puppet, puppetserver, haproxy).
mod puppet_reports;
// Signed generations: the manifest the pipeline signs is the one the masters serve.
mod trust;
// The agent with [trust] root: a signed generation synced; unsigned, withdrawn, replayed, expired metadata and bundles refused (exit 65).
mod trust_agent;
// The operator's workflow with the real tuftool: the quick start's keys, r10k deploys signed by scripts/sign-generation.sh, two masters, agents taking the signed deploy and refusing the unsigned one (needs `tuftool`, `r10k`).
mod trust_tuftool;
// A master with [trust] root: a hand-changed tree not published (stock puppet and our agent keep the signed one) until signed; check and metrics say signed/unsigned/expired.
mod trust_master;
// Puppet Server as our agent's source and a stock Puppet agent as our master's client (needs both).
mod puppet_server;
