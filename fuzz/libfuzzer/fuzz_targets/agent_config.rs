//! libFuzzer entry for the `agent_config` target; the body and its properties are
//! `pluginsync_fuzz::agent_config` (fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pluginsync_fuzz::agent_config(data));
